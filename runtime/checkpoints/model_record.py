"""How the model a checkpoint was saved from compares with this one: its units with their parameters (names,
shapes, offsets, optimizer classes) and its persistent buffers, as `ShardLayout.model_record`/`buffer_record` wrote
them into the marker.

A checkpoint loads only into a model it describes alike (`model_difference`, `buffer_difference`): the same
parameters in the same units and the same buffers; offsets inside a unit may differ (`reshard.layout_runs`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from zerotrain.runtime.checkpoints.shard_file import ShardFileError, ShardReader


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def rank_file_bytes(path: str | os.PathLike[str], rank: int) -> int:
    """Size of `rank`'s file in checkpoint `path` (0 if it has none)."""
    f = Path(path) / rank_file(rank)
    return f.stat().st_size if f.exists() else 0


BUFFER_PREFIX = "buffer."
"""A persistent buffer's tensor name in a rank file: `buffer.<its name in the model>`."""


def buffer_difference(saved: list[list[Any]] | None, mine: list[list[Any]]) -> str | None:
    """The first way the saved buffers differ from this model's (None when alike, or when the checkpoint predates
    saving buffers: `saved` is None)."""
    if saved is None:
        return None
    old, new = {b[0]: b[1] for b in saved}, {b[0]: b[1] for b in mine}
    for name in sorted(old.keys() ^ new.keys()):
        where = "the checkpoint but not in this model" if name in old else "this model but not in the checkpoint"
        return f"buffer {name!r} is in {where}"
    for name in sorted(old):
        if old[name] != new[name]:
            return f"buffer {name!r} has shape {old[name]} in the checkpoint but {new[name]} in this model"
    return None


def model_difference(saved: list[dict[str, Any]], mine: list[dict[str, Any]]) -> str | None:
    """The first way the saved model differs from this one, in words; None when they are the same."""
    old = {p[0]: (u["unit"], p[1], p[2]) for u in saved for p in u["params"]}
    new = {p[0]: (u["unit"], p[1], p[2]) for u in mine for p in u["params"]}
    for name in sorted(old.keys() - new.keys()):
        return f"parameter {name!r} is in the checkpoint but not in this model"
    for name in sorted(new.keys() - old.keys()):
        return f"parameter {name!r} of this model is not in the checkpoint"
    for name, (unit, shape, _) in sorted(old.items()):
        if shape != new[name][1]:
            return f"parameter {name!r} has shape {shape} in the checkpoint but {new[name][1]} in this model"
        # Offsets inside a unit may differ (a checkpoint from before parameters were aligned): loading maps them.
        if unit != new[name][0]:
            return (
                f"parameter {name!r} sits in unit {unit} in the checkpoint but in unit {new[name][0]} here "
                "(was spec.zero.unitModules changed?)"
            )
    if [u["unit"] for u in saved] != [u["unit"] for u in mine]:
        return f"units differ: {[u['unit'] for u in saved]} in the checkpoint, {[u['unit'] for u in mine]} here"
    return None


def buffer_file(readers: list[ShardReader], rank: int) -> int:
    """Which file holds the buffers `rank` restores: its own when it saved its own, else rank 0's."""
    holds = {r.record["rank"]: i for i, r in enumerate(readers) if any(n.startswith(BUFFER_PREFIX) for n in r.names)}
    if rank in holds:
        return holds[rank]
    if 0 not in holds:
        raise ShardFileError(f"{rank_file(0)}: holds no model buffers although the checkpoint lists them")
    return holds[0]


def read_buffers(reader: ShardReader) -> dict[str, torch.Tensor]:
    """The model buffers one rank file holds, by name."""
    return {
        n.removeprefix(BUFFER_PREFIX): reader.tensor(n) for n in sorted(reader.names) if n.startswith(BUFFER_PREFIX)
    }
