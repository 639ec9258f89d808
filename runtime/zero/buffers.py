"""The model's buffers: which the engine keeps, and how the ranks agree on them.

Buffers are not sharded: every rank holds each whole, as DDP does. The engine keeps the *persistent* ones, exactly
those a module's `state_dict()` lists (BatchNorm's `running_mean`, `running_var` and `num_batches_tracked`, a
step counter): they are in `full_state_dict()`, in every checkpoint and every export. Non-persistent buffers
(`register_buffer(..., persistent=False)`: rotary frequencies, causal masks) are state a module rebuilds itself:
left out, as PyTorch leaves them out.

With `zero.broadcastBuffers` (the default, DDP's `broadcast_buffers=True`), rank 0's buffers are broadcast to every
rank before each forward, one collective per dtype: every rank's forward runs with the same running statistics,
and a checkpoint records rank 0's. Between that broadcast and the next, a training forward updates each rank's
statistics from its own micro-batch (as under DDP). Without it each rank keeps its own, and each rank's checkpoint
file records its own; a rank with no saved counterpart (a larger world) starts from rank 0's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zerotrain.runtime.zero.collectives import Comm

UNIT = "<buffers>"
"""The label buffer broadcasts are counted under (`comm_report`)."""


@dataclass(frozen=True)
class BufferSlot:
    """One persistent buffer: the name it is saved under, its shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers `model.state_dict()` holds, by name, each tensor once (a buffer shared by two modules under its
    first name, as named_buffers() lists it)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        skipped = module._non_persistent_buffers_set
        for name, buf in module._buffers.items():
            if buf is None or name in skipped or id(buf) in seen:
                continue
            seen.add(id(buf))
            out[f"{prefix}.{name}" if prefix else name] = buf
    return out


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


class ModelBuffers:
    """The persistent buffers of one model, and the broadcast that keeps the ranks on rank 0's values."""

    def __init__(self, model: nn.Module, comm: Comm, broadcast: bool) -> None:
        self.model = model
        self.comm = comm
        self.broadcast = broadcast
        """zero.broadcastBuffers: rank 0's values before each forward; False keeps each rank's own."""
        self.slots = [BufferSlot(n, tuple(b.shape), b.dtype) for n, b in persistent_buffers(model).items()]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live buffers by name (looked up each time: a module may re-assign a buffer rather than update it)."""
        live = persistent_buffers(self.model)
        return {s.name: live[s.name] for s in self.slots if s.name in live}

    def sync(self) -> None:
        """Rank 0's buffers into every rank's (with broadcastBuffers; a no-op without, or with none)."""
        if self.broadcast and self.slots:
            self._broadcast(list(self.tensors().values()))

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        """One broadcast per (device, dtype) group: packed, sent from rank 0, copied back in place."""
        if self.comm.world_size == 1:
            return
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for group in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            self.comm.broadcast(flat, 0, UNIT)
            with torch.no_grad():
                for t, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
                    t.copy_(part.view_as(t))

    def rank0_values(self) -> dict[str, torch.Tensor]:
        """Copies of rank 0's buffers on every rank (a collective when the ranks' buffers may differ)."""
        copies = {n: t.detach().clone() for n, t in self.tensors().items()}
        self._broadcast(list(copies.values()))
        return copies

    def load(self, values: dict[str, torch.Tensor]) -> None:
        """Copy saved values into the live buffers (same names and shapes, converted to each buffer's dtype)."""
        live = self.tensors()
        with torch.no_grad():
            for name, value in values.items():
                live[name].copy_(value.to(live[name].device).view_as(live[name]))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def move_buffers(model: nn.Module, device: torch.device) -> None:
    """Every buffer (persistent or not) to `device`, leaving the parameters where they are: a model whose parameters
    are still placeholders (partitioned construction) cannot be moved whole with `.to()`."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != device:
                module._buffers[name] = buf.to(device)


def replace_buffer(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Set buffer `name` to `value` (kept as the module's buffer object when it is one already)."""
    module, leaf = _owner(model, name)
    module._buffers[leaf] = value
