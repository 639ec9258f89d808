"""Contiguous 1-D storage of one unit's parameters, with the model's parameters as views into it.

The model keeps its own `nn.Parameter` objects (optimizers, hooks and user code hold references);
only their `.data` is pointed at views of the flat buffer, once. Stage 3 frees the gathered buffer
by shrinking its storage to zero bytes and re-allocates the same storage before the next gather,
so the parameters' views - and tensors autograd saved for backward, which are those views - see the
data again without being re-pointed. Data is written into the buffer itself, never through the
parameters, so autograd's version counters on the parameters stay untouched (FSDP1's technique).
"""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.zero.partition import ParamSlot, UnitLayout


class FlatBuffer:
    """One unit's flat buffer of `layout.padded` elements and the views of its parameters."""

    def __init__(self, layout: UnitLayout, dtype: torch.dtype, device: torch.device) -> None:
        self.layout = layout
        self.data = torch.zeros(layout.padded, dtype=dtype, device=device)
        self._nbytes = self.data.untyped_storage().nbytes()

    def view(self, slot: ParamSlot) -> torch.Tensor:
        return self.data[slot.offset : slot.offset + slot.numel].view(slot.shape)

    def bind(self, params: list[nn.Parameter]) -> None:
        """Point every parameter's `.data` at its view (metadata only; later frees keep the views). A placeholder on
        the meta device (partitioned construction) cannot take another device's data: it is swapped for a parameter
        over the view, keeping the object, its attributes and hooks."""
        for slot, p in zip(self.layout.slots, params, strict=True):
            if p.is_meta:
                attrs = dict(p.__dict__)
                torch.utils.swap_tensors(p, nn.Parameter(self.view(slot), requires_grad=p.requires_grad))
                p.__dict__.update(attrs)
            else:
                p.data = self.view(slot)

    def bind_grads(self, params: list[nn.Parameter]) -> None:
        """Make each trainable parameter's `.grad` a view, so autograd accumulates into the flat buffer in place."""
        for slot, p in zip(self.layout.slots, params, strict=True):
            if p.requires_grad:
                p.grad = self.view(slot)

    @property
    def allocated(self) -> bool:
        return self.data.untyped_storage().nbytes() > 0

    def free(self) -> None:
        self.data.untyped_storage().resize_(0)

    def allocate(self) -> None:
        if not self.allocated:
            self.data.untyped_storage().resize_(self._nbytes)

    def nbytes(self) -> int:
        return self.data.untyped_storage().nbytes()

    def shard(self, rank: int) -> torch.Tensor:
        lo, hi = self.layout.shard_range(rank)
        return self.data[lo:hi]


def fill_rows(
    rows: torch.Tensor, grads: list[tuple[ParamSlot, torch.Tensor]], shard_numel: int, a: int, b: int
) -> None:
    """Write shard columns `[a, b)` of every rank's shard of a unit into `rows` (N × (b-a)) from the
    parameters' flat gradients; zeros where no gradient, a frozen parameter or padding lies."""
    rows.zero_()
    for r in range(rows.shape[0]):
        lo, hi = r * shard_numel + a, r * shard_numel + b
        for slot, g in grads:
            x, y = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
            if x < y:
                rows[r, x - lo : y - lo].copy_(g[x - slot.offset : y - slot.offset])
