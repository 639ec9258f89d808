"""Activation checkpointing per unit (ZeRO-R), integrated with stage-3 gathering, and optional CPU offload.

Each unit module's `forward` is replaced by a non-reentrant `torch.utils.checkpoint` of the original,
so only the unit's inputs are saved and its activations are recomputed in backward. The recompute
calls the original `forward`, not the module, so no forward hook fires again: in stage 3 the unit
is gathered once by its pre-backward trigger and that one gather serves recompute and backward
(communication stays 3Ψ per step). With offload, the saved inputs are moved to host memory
(`save_on_cpu`, pinned when training on CUDA) and copied back on use; on a CPU-only run they are host copies too.

ZeRO-R's partitioned activation checkpoints (Pa) split each checkpointed input across the tensor-parallel group
that replicates it. This runtime is data parallel only: a rank's activations belong to its own micro-batch, no
other rank holds them, and there is nothing to partition (`ZeroConfig.partition_activations` is refused). With a
tensor-parallel group, `_checkpointed` is where each saved input would be sliced to this rank's 1/T before the
checkpoint stores it and all-gathered over that group before recompute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class _CountedOffload(torch.autograd.graph.save_on_cpu):
    """torch's offload to host memory, telling `observe` what it keeps (it takes those tensors before any outer
    hook, such as the engine's activation counter, would see them)."""

    def __init__(self, observe: Callable[[torch.Tensor], None], pin: bool) -> None:
        super().__init__(pin_memory=pin)
        pack = self.pack_hook

        def counted(t: torch.Tensor) -> Any:
            packed = pack(t)
            observe(packed[1])
            return packed

        self.pack_hook = counted


def _checkpointed(
    forward: Callable[..., Any], offload: bool, observe: Callable[[torch.Tensor], None], pin: bool
) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if offload:
            with _CountedOffload(observe, pin):
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_checkpointing(
    modules: list[nn.Module], offload: bool, observe: Callable[[torch.Tensor], None], device: torch.device
) -> None:
    """Recompute each module's activations in backward instead of keeping them; `observe` counts what the offload
    keeps in host memory. Offloaded copies are pinned only when training on CUDA (pinned host memory is what makes
    the copies back asynchronous; for CPU training it would only lock pages)."""
    for module in modules:
        module.forward = _checkpointed(module.forward, offload, observe, device.type == "cuda")
