"""Activation checkpointing per unit (ZeRO-R), integrated with stage-3 gathering, and optional CPU offload.

Each unit module's `forward` is replaced by a non-reentrant `torch.utils.checkpoint` of the original,
so only the unit's inputs are saved and its activations are recomputed in backward. The recompute
calls the original `forward`, not the module, so no forward hook fires again: in stage 3 the unit
is gathered once by its pre-backward trigger and that one gather serves recompute and backward
(communication stays 3Ψ per step). With offload, the saved inputs are moved to host memory
(`save_on_cpu`, pinned on CUDA) and copied back on use; on a CPU-only run they are host copies too.

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


def _checkpointed(forward: Callable[..., Any], offload: bool) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_checkpointing(modules: list[nn.Module], offload: bool) -> None:
    """Recompute each module's activations in backward instead of keeping them."""
    for module in modules:
        module.forward = _checkpointed(module.forward, offload)
