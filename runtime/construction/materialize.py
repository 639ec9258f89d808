"""The engine's `ParameterSource` for a partitioned model: one unit at a time, whole, then only the rank's range.

For each unit the engine builds, every rank contributes its slices of the unit's parameters to one all-gather (on
the engine's device, counted in its communication report as `construction`), so each rank briefly holds that unit's
parameters whole: the `largest unit` of the start-up peak. A parameter whose init ran after it was handed over has
those writes replayed on its real values (`deferred.replay`); then the rank keeps its range of the unit and the
unit's slices are dropped. The values are exactly those an ordinary construction with the same seed gives, on
every rank and at every world size and stage: nothing depends on which rank drew them.
"""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.construction.deferred import replay
from zerotrain.runtime.construction.placeholders import Held, Slices
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.partition import UnitLayout

LABEL = "construction"
"""The communication report's name for the gathers that assemble each unit at start-up."""


class ConstructedValues:
    """Starting values of a partitioned model's units (see the module docstring)."""

    def __init__(self, slices: Slices, model: nn.Module) -> None:
        self.held: dict[str, Held] = {}
        for name, param in model.named_parameters():
            held = slices.held(param)
            assert held is not None, f"{name} was not handed over"
            self.held[name] = held
        self.world_size = slices.world_size

    def _gather(self, names: list[str], device: torch.device, comm: Comm, unit: str) -> torch.Tensor:
        """Every rank's slices of the named parameters, one row per rank (a collective on every rank)."""
        helds = [self.held[n] for n in names]
        wide = torch.float64 if any(h.dtype == torch.float64 for h in helds) else torch.float32
        send = torch.cat([h.piece.to(wide) for h in helds]).to(device)
        recv = torch.empty(send.numel() * self.world_size, dtype=wide, device=device)
        comm.all_gather(recv, send, unit, label=LABEL)
        return recv.view(self.world_size, -1)

    def _whole(self, held: Held, columns: torch.Tensor) -> torch.Tensor:
        """One parameter's values as constructed, its later init writes replayed: on the CPU, where they were
        drawn."""
        values = torch.empty_strided(held.size, held.stride, dtype=held.dtype)
        values.copy_(columns.reshape(-1)[: held.numel].view(held.size))
        replay(held, values)
        return values

    def whole(self, names: list[str], device: torch.device, comm: Comm, unit: str) -> dict[str, torch.Tensor]:
        """The named parameters' whole constructed values (a collective on every rank)."""
        rows, out, column = self._gather(names, device, comm, unit), {}, 0
        for name in names:
            held = self.held[name]
            width = held.piece.numel()
            out[name] = self._whole(held, rows[:, column : column + width]).to(device)
            column += width
        return out

    def drop(self, names: list[str]) -> None:
        """Forget parameters whose values come from elsewhere (pretrained weights)."""
        for name in names:
            self.held.pop(name, None)

    def fill(
        self, layout: UnitLayout, lo: int, hi: int, out: torch.Tensor, comm: Comm, only: set[str] | None = None
    ) -> None:
        """The unit's range from the construction; with `only`, just those parameters' part of it (the rest of
        `out` is left as it is, and no other slice is sent)."""
        slots = [s for s in layout.slots if only is None or s.name in only]
        rows = self._gather([s.name for s in slots], out.device, comm, layout.name)
        if only is None:
            out.zero_()
        column = 0
        for slot in slots:
            held = self.held.pop(slot.name)  # its slices are in the engine after this
            width = held.piece.numel()
            columns, column = rows[:, column : column + width], column + width
            a, b = max(lo, slot.offset) - slot.offset, min(hi, slot.offset + slot.numel) - slot.offset
            if a >= b:
                continue
            at = slot.offset + a - lo  # where element a of the parameter goes in `out`
            if held.deferred:
                whole = self._whole(held, columns).reshape(-1)
                out[at : at + b - a].copy_(whole[a:b])
                continue
            for r in range(self.world_size):  # rank r's piece holds elements [r·width, (r+1)·width)
                x, y = max(a, r * width), min(b, (r + 1) * width)
                if x < y:
                    out[at + x - a : at + y - a].copy_(columns[r, x - r * width : y - r * width])
