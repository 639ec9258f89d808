"""Where a unit's starting values come from.

The engine builds its units one at a time, in order, on every rank, and asks its `ParameterSource` for the fp32
values of only the range of each unit's flat buffer (`partition.UnitLayout`) its stage keeps: the rank's shard at
stages 1-3, the whole unit at stage 0. So no stage makes a full-size fp32 copy of the model to drop it again; stages
1 and 2 gather their full compute-dtype parameters from the shards, as after every step.

- `ModelValues` (the default): the model's own parameters as its caller built them, every rank taking rank 0's
  (one broadcast per unit: the caller holds the whole model anyway, and ranks seeded differently still agree).
- A partitioned construction's values and pretrained weights (`zerotrain.runtime.construction`), which never hold
  more than one unit beyond the rank's shard.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.partition import UnitLayout


class ParameterSource(Protocol):
    """Fills ranges of the units' flat fp32 values; called on every rank, unit by unit in the engine's order."""

    def fill(self, layout: UnitLayout, lo: int, hi: int, out: torch.Tensor, comm: Comm) -> None:
        """Write elements [lo, hi) of `layout`'s flat buffer into `out` (fp32, hi - lo elements, on the engine's
        device): each parameter's values at its slot's offset, zeros in the alignment gaps and the padding. `comm`
        spans every rank (its traffic is the engine's): a source's collectives go through it."""
        ...


class ValueOf(Protocol):
    """One parameter's whole values by name."""

    def __call__(self, name: str) -> torch.Tensor: ...


def scatter_slots(layout: UnitLayout, lo: int, hi: int, out: torch.Tensor, value_of: ValueOf) -> None:
    """Fill [lo, hi) from whole parameters: `value_of(name)` gives one parameter's values (any dtype and device),
    of which only the part inside the range is copied."""
    out.zero_()
    for slot in layout.slots:
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if a < b:
            flat = value_of(slot.name).reshape(-1)
            out[a - lo : b - lo].copy_(flat[a - slot.offset : b - slot.offset])


class ModelValues:
    """The model's own parameter values, rank 0's on every rank: the whole unit is assembled and broadcast, then
    the range is kept."""

    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())

    def fill(self, layout: UnitLayout, lo: int, hi: int, out: torch.Tensor, comm: Comm) -> None:
        whole = torch.empty(layout.padded, dtype=torch.float32, device=out.device)
        scatter_slots(layout, 0, layout.padded, whole, lambda name: self.params[name].detach())
        # Every rank starts from rank 0's values, whatever seed each used.
        comm.broadcast(whole, 0, layout.name)
        out.copy_(whole[lo:hi])
