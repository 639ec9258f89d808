"""Mixed precision: dtype mapping and dynamic loss scaling for fp16."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from zerotrain.zero_config import LossScaleConfig, Precision

DTYPES: dict[Precision, torch.dtype] = {
    Precision.FP32: torch.float32,
    Precision.BF16: torch.bfloat16,
    Precision.FP16: torch.float16,
}


class LossScaler:
    """Dynamic loss scale: shrink and skip the step on overflow, grow after `growth_interval` clean steps.

    Disabled (scale 1, never skips) unless compute is fp16; bf16 has fp32's range.
    """

    def __init__(self, cfg: LossScaleConfig, enabled: bool) -> None:
        self.cfg, self.enabled = cfg, enabled
        self.scale = cfg.initial_scale if enabled else 1.0
        self.skipped_steps = 0
        self._clean = 0

    def update(self, overflow: bool) -> bool:
        """Record one step's outcome; True when the step must be skipped."""
        if not self.enabled:
            return False
        if overflow:
            self.scale = max(self.cfg.min_scale, self.scale * self.cfg.backoff_factor)
            self.skipped_steps += 1
            self._clean = 0
            return True
        self._clean += 1
        if self._clean >= self.cfg.growth_interval:
            self.scale *= self.cfg.growth_factor
            self._clean = 0
        return False

    def state_dict(self) -> dict[str, float | int]:
        """Everything that decides future scales: a resumed run skips and grows exactly as the original would."""
        return {"scale": self.scale, "skipped_steps": self.skipped_steps, "clean_steps": self._clean}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.skipped_steps = int(state["skipped_steps"])
        self._clean = int(state["clean_steps"])


def cast_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Floating-point inputs in the compute dtype (as FSDP's mixed precision does); others untouched."""
    if dtype == torch.float32:
        return args, kwargs

    def cast(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    return pytree.tree_map(cast, args), pytree.tree_map(cast, kwargs)
