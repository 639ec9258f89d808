"""Loading a sharded checkpoint into this rank's buffers at any world size or stage, range by range.

Every rank file records, per unit, the unit-coordinate range its fp32 master covers, and for each optimizer
parameter the (unit, start, stop) range it covers. Loading is planned first, as pure arithmetic: each range this
rank now holds is cut into pieces, each piece naming one saved tensor and the offset to read from (this rank's own
file first, so at an unchanged layout a rank reads only its own file). Elements past the unit's real size are
padding and read as zeros. Only then are bytes read, chunk by chunk, straight into the engine's buffers: a rank
holds its own shard plus one chunk, never the model. Element-wise optimizers make this exact; scalar state
(Adam's `step`) is the same for every parameter and is copied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from zerotrain.runtime.checkpoints.shard_file import ShardReader


class ReshardError(Exception):
    """The saved ranges cannot fill this rank's: a file is missing a range, a tensor or a state key."""


@dataclass(frozen=True)
class Source:
    """A saved 1-D tensor covering unit-coordinate range [lo, hi)."""

    file: int
    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Piece:
    """Copy `length` elements from `name` in file `file` at `src` to offset `dst` of the target."""

    file: int
    name: str
    src: int
    dst: int
    length: int


@dataclass
class TargetPlan:
    """How to fill one target buffer (a unit's master, or one optimizer state tensor)."""

    pieces: list[Piece]
    numel: int
    dtype: torch.dtype = torch.float32


@dataclass
class LoadPlan:
    """Everything to read, decided before anything is read or changed."""

    masters: list[TargetPlan | None]
    """Per unit, how to fill its master; None: the checkpoint holds none of it (a frozen unit whose values come from
    the base it refers to), left as it is."""
    optimizer: dict[int, dict[str, TargetPlan]] = field(default_factory=dict)
    """Per optimizer parameter index, per per-element state key."""
    scalars: dict[str, Any] = field(default_factory=dict)
    """Scalar optimizer state (key -> (file, tensor name) or a JSON value), the same for every parameter."""

    def files(self) -> set[int]:
        """The rank files this plan reads."""
        out = {p.file for t in self.masters if t is not None for p in t.pieces}
        out |= {p.file for per in self.optimizer.values() for t in per.values() for p in t.pieces}
        out |= {v[0] for v in self.scalars.values() if isinstance(v, tuple)}
        return out


def cover(sources: Sequence[Source], lo: int, hi: int, valid: int, what: str) -> list[Piece]:
    """Pieces filling [lo, hi) from `sources` in preference order; [valid, hi) may stay unfilled (padding)."""
    pieces, cursor = [], lo
    while cursor < min(hi, valid):
        src = next((s for s in sources if s.lo <= cursor < s.hi), None)
        if src is None:
            raise ReshardError(f"{what}: elements from {cursor} are in no rank file of this checkpoint")
        stop = min(src.hi, hi)
        pieces.append(Piece(src.file, src.name, cursor - src.lo, cursor - lo, stop - cursor))
        cursor = stop
    return pieces


Runs = list[tuple[int, int, int]]
"""A unit's parameters as (start, stop, saved start): where each lies here and where the checkpoint has it, when the
checkpoint's layout inside the unit differs (one saved before parameters were aligned, say)."""


def cover_mapped(sources: Sequence[Source], lo: int, hi: int, runs: Runs, what: str) -> list[Piece]:
    """Pieces filling the parameters' elements of [lo, hi) from their saved places; the rest (alignment gaps,
    padding) stays unfilled, so reads as zeros."""
    pieces = []
    for start, stop, saved in runs:
        x, y = max(lo, start), min(hi, stop)
        if x < y:
            shift = saved - start
            for p in cover(sources, x + shift, y + shift, y + shift, what):
                pieces.append(Piece(p.file, p.name, p.src, p.dst + x - lo, p.length))
    return pieces


def layout_runs(saved: Sequence[dict[str, Any]], mine: Sequence[dict[str, Any]]) -> dict[int, Runs]:
    """Per unit whose parameters sit elsewhere in the checkpoint than here, their runs (see `Runs`); units laid out
    alike are left out. Both are `ShardLayout.model_record` records of the same units and parameters."""
    out: dict[int, Runs] = {}
    for index, (old, new) in enumerate(zip(saved, mine, strict=True)):
        where = {p[0]: p[2] for p in old["params"]}
        runs = [(p[2], p[2] + math.prod(p[1]), where[p[0]]) for p in new["params"]]
        if any(start != saved_at for start, _, saved_at in runs):
            out[index] = runs
    return out


def _cover_unit(sources: Sequence[Source], lo: int, hi: int, valid: int, runs: Runs | None, what: str) -> list[Piece]:
    return cover(sources, lo, hi, valid, what) if runs is None else cover_mapped(sources, lo, hi, runs, what)


def _prefer(readers: Sequence[ShardReader], own: int) -> list[int]:
    return sorted(range(len(readers)), key=lambda i: (readers[i].record["rank"] != own, i))


def master_sources(readers: Sequence[ShardReader], order: Sequence[int], unit: int) -> list[Source]:
    """Every file's fp32 master range of `unit`, in preference order."""
    return [Source(f, f"master.{unit}", *readers[f].record["master_ranges"][unit]) for f in order]


@dataclass
class OptimizerSources:
    """Where the saved optimizer state lies: per (unit, key) the ranges of its per-element tensors, and the scalar
    state (key -> (file, tensor name), or a JSON value), which is the same for every parameter."""

    elements: dict[tuple[int, str], list[Source]] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)

    def scalar_values(self, readers: Sequence[ShardReader]) -> dict[str, Any]:
        return {k: readers[v[0]].tensor(v[1]) if isinstance(v, tuple) else v for k, v in self.scalars.items()}


def optimizer_sources(readers: Sequence[ShardReader], order: Sequence[int]) -> OptimizerSources:
    """Scan every file's record (headers only) for its optimizer state, files in preference order."""
    found = OptimizerSources()
    for f in order:
        r = readers[f]
        for idx, (unit, a, b) in enumerate(r.record["optimizer_segments"]):
            for key in r.record["optimizer_keys"].get(str(idx), []):
                name = f"optim.{idx}.{key}"
                if r.shape(name) == [b - a] and b > a:
                    found.elements.setdefault((unit, key), []).append(Source(f, name, a, b))
                else:
                    found.scalars.setdefault(key, (f, name))
            for key, value in r.record["optimizer_scalars"].get(str(idx), {}).items():
                found.scalars.setdefault(key, value)
    return found


def plan_load(
    readers: Sequence[ShardReader],
    own_rank: int,
    units: Sequence[tuple[str, int, tuple[int, int]]],
    segments: Sequence[tuple[int, int, int]],
    remap: dict[int, Runs] | None = None,
    left_out: set[int] | None = None,
) -> LoadPlan:
    """Plan this rank's load: `units` are (name, extent, master range), `segments` its optimizer ranges, `remap`
    the units whose parameters the checkpoint holds at other offsets (`layout_runs`), `left_out` the units it does
    not hold (`base.left_out`)."""
    remap = remap or {}
    order = _prefer(readers, own_rank)
    plan = LoadPlan(masters=[])
    for ui, (uname, numel, (lo, hi)) in enumerate(units):
        if left_out and ui in left_out:
            plan.masters.append(None)
            continue
        sources = master_sources(readers, order, ui)
        pieces = _cover_unit(sources, lo, hi, numel, remap.get(ui), f"unit {uname} master")
        plan.masters.append(TargetPlan(pieces, hi - lo))
    saved = optimizer_sources(readers, order)
    plan.scalars = saved.scalars
    keys = sorted({key for _, key in saved.elements})
    for idx, (unit, a, b) in enumerate(segments):
        if unit < 0 or not keys:
            continue
        uname, numel, _ = units[unit]
        per: dict[str, TargetPlan] = {}
        for key in keys:
            sources = saved.elements.get((unit, key), [])
            dtype = readers[sources[0].file].dtype(sources[0].name) if sources else torch.float32
            pieces = _cover_unit(sources, a, b, numel, remap.get(unit), f"unit {uname} optimizer {key!r}")
            per[key] = TargetPlan(pieces, b - a, dtype)
        plan.optimizer[idx] = per
    return plan


def read_range(readers: Sequence[ShardReader], sources: Sequence[Source], lo: int, hi: int, what: str) -> torch.Tensor:
    """Elements [lo, hi) of a unit, assembled from `sources` into a new fp32 tensor (every element must be saved)."""
    out = torch.empty(hi - lo, dtype=torch.float32)
    fill(readers, TargetPlan(cover(sources, lo, hi, hi, what), hi - lo), out)
    return out


def fill(readers: Sequence[ShardReader], target: TargetPlan, out: torch.Tensor) -> None:
    """Read a planned target into `out` (zeros where no piece lands: padding)."""
    out.zero_()
    for p in target.pieces:
        readers[p.file].read_into(p.name, p.src, out[p.dst : p.dst + p.length])


def optimizer_state(readers: Sequence[ShardReader], plan: LoadPlan, device: torch.device) -> dict[int, dict[str, Any]]:
    """This rank's optimizer state by parameter index, read as planned."""
    scalars = OptimizerSources(scalars=plan.scalars).scalar_values(readers)
    state: dict[int, dict[str, Any]] = {}
    for idx, per in plan.optimizer.items():
        entry: dict[str, Any] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in scalars.items()}
        for key, target in per.items():
            buf = torch.empty(target.numel, dtype=target.dtype, device=device)
            fill(readers, target, buf)
            entry[key] = buf
        state[idx] = entry
    return state
