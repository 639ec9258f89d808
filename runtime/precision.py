"""Mixed precision: dtype mapping and dynamic loss scaling for fp16."""

from __future__ import annotations

import torch

from zerotrain.runtime.config import LossScaleConfig, Precision

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
