"""Sharded checkpoints: every rank saves what only it holds; a commit marker, written last, makes one valid.

Layout under the checkpoint directory:

    step-00000050/rank-00000.pt ... rank-0000{N-1}.pt   each rank's fp32 master shards, optimizer state,
                                                          loss scale and counters
    step-00000050/COMMITTED                              written by rank 0 after every rank has saved

A crash mid-save leaves a directory without COMMITTED, which `latest()` ignores, so a restarted gang
resumes from the newest complete checkpoint. With the same world size and stage each rank reads only
its own file; with another world size or stage every rank reads all files and takes its ranges
(`reshard`). The model and its units must be the same. The compute parameters are then rebuilt from
the masters exactly as after an optimizer step. The directory must be shared by all ranks (rank 0
writes the marker after a collective that proves every rank's file is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from zerotrain.runtime.errors import ZeroSetupError
from zerotrain.runtime.reshard import load_resharded

if TYPE_CHECKING:
    from zerotrain.runtime.engine import ZeroEngine

COMMITTED = "COMMITTED"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def latest(root: str | Path) -> Path | None:
    """The newest committed checkpoint under `root`, or None."""
    done = sorted(p.parent for p in Path(root).glob(f"step-*/{COMMITTED}"))
    return done[-1] if done else None


def _units(engine: ZeroEngine) -> list[tuple[str, int]]:
    return [(u.name, u.layout.numel) for u in engine.units]


def _layout(engine: ZeroEngine) -> dict[str, Any]:
    return {"stage": int(engine.config.stage), "world_size": engine.world_size, "units": _units(engine)}


def save(engine: ZeroEngine, root: str | Path) -> Path:
    """Save this rank's shard of the training state at the engine's current step; a collective on every rank."""
    target = step_dir(Path(root), engine.steps)
    target.mkdir(parents=True, exist_ok=True)
    state = {
        "layout": _layout(engine),
        "masters": [u.master.detach().clone() for u in engine.units],
        "master_ranges": [engine.master_range(u) for u in engine.units],
        "optimizer_segments": engine.optimizer_segments,
        "optimizer": engine.optimizer.state_dict(),
        "scaler": {"scale": engine.scaler.scale, "skipped": engine.scaler.skipped_steps},
        "steps": engine.steps,
        "micro_steps": engine.micro_steps,
    }
    tmp = target / f"rank-{engine.rank:05d}.pt.tmp"
    torch.save(state, tmp)
    tmp.rename(target / f"rank-{engine.rank:05d}.pt")
    # Every rank's file is in place once this completes; only then may the marker exist.
    done = torch.ones(1)
    engine.comm.all_reduce(done, "<checkpoint>")
    if engine.rank == 0:
        (target / COMMITTED).write_text(f"{engine.steps}\n")
    return target


def load(engine: ZeroEngine, path: str | Path) -> None:
    """Restore this rank's shard from a committed checkpoint directory; a collective on every rank."""
    path = Path(path)
    if not (path / COMMITTED).exists():
        raise ZeroSetupError("checkpoint", str(path), "not a committed checkpoint", "pass a directory latest() returns")
    mine = path / f"rank-{engine.rank:05d}.pt"
    state = torch.load(mine, map_location=engine.units[0].master.device) if mine.exists() else None
    if state is not None and state["layout"] == _layout(engine):
        with torch.no_grad():
            for u, master in zip(engine.units, state["masters"], strict=True):
                u.master.copy_(master)
        engine.optimizer.load_state_dict(state["optimizer"])
    else:
        saved = torch.load(next(path.glob("rank-*.pt")), map_location="cpu")["layout"]
        if saved["units"] != _units(engine):
            raise ZeroSetupError(
                "checkpoint",
                str(path),
                "saved from a model with other units or parameter counts",
                "resume with the same model and zero.unitModules",
            )
        state = load_resharded(engine, path)
    engine.scaler.scale = state["scaler"]["scale"]
    engine.scaler.skipped_steps = state["scaler"]["skipped"]
    engine.steps, engine.micro_steps = state["steps"], state["micro_steps"]
    for u in engine.units:
        engine.strategy.after_step(u)
