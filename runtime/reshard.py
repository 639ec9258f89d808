"""Loading a sharded checkpoint at another world size or stage: reassemble, then re-slice.

Every rank file records, per unit, the unit-coordinate range its fp32 master covers, and for each
optimizer parameter the (unit, start, stop) range it covers. Reading every rank's file, each unit's
full master and each per-element optimizer state (Adam's moments, SGD's momentum, ...) are laid
out in unit coordinates; the new engine then takes its own ranges. Scalar state (Adam's `step`)
is the same for every parameter and is copied. Element-wise optimizers make this exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from zerotrain.runtime.engine import ZeroEngine


def _full_masters(engine: ZeroEngine, states: list[dict[str, Any]]) -> list[torch.Tensor]:
    fulls = []
    for u in engine.units:
        size = max(u.layout.padded, *(st["master_ranges"][u.index][1] for st in states))
        full = torch.zeros(size, dtype=torch.float32)
        for st in states:
            lo, hi = st["master_ranges"][u.index]
            full[lo:hi] = st["masters"][u.index].float().cpu()
        fulls.append(full)
    return fulls


def _full_optimizer_state(
    engine: ZeroEngine, states: list[dict[str, Any]]
) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    per_unit: list[dict[str, torch.Tensor]] = [{} for _ in engine.units]
    scalars: dict[str, Any] = {}
    for st in states:
        saved = st["optimizer"]["state"]
        for idx, (unit, a, b) in enumerate(st["optimizer_segments"]):
            if unit < 0 or idx not in saved:
                continue
            for key, value in saved[idx].items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == b - a:
                    size = max(engine.units[unit].layout.padded, b)
                    full = per_unit[unit].setdefault(key, torch.zeros(size, dtype=value.dtype))
                    full[a:b] = value.cpu()
                else:
                    scalars[key] = value
    return per_unit, scalars


def load_resharded(engine: ZeroEngine, path: Path) -> dict[str, Any]:
    """Set this rank's masters and optimizer state from every rank's file; returns one file's state."""
    states = [torch.load(f, map_location="cpu") for f in sorted(path.glob("rank-*.pt"))]
    masters = _full_masters(engine, states)
    with torch.no_grad():
        for u in engine.units:
            lo, hi = engine.master_range(u)
            u.master.copy_(masters[u.index][lo:hi])
    per_unit, scalars = _full_optimizer_state(engine, states)
    new_state: dict[int, dict[str, Any]] = {}
    for idx, (unit, a, b) in enumerate(engine.optimizer_segments):
        if unit < 0 or not per_unit[unit]:
            continue
        entry = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in scalars.items()}
        entry.update({k: full[a:b].clone() for k, full in per_unit[unit].items()})
        new_state[idx] = entry
    sd = engine.optimizer.state_dict()
    sd["state"] = new_state
    engine.optimizer.load_state_dict(sd)
    return states[0]
