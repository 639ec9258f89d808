"""Sharded checkpoints: every rank saves what only it holds; a commit marker, written last, makes one valid.

Layout under the checkpoint directory:

    step-00000050/rank-00000.pt ... rank-0000{N-1}.pt   each rank's fp32 master shards, optimizer state,
                                                          loss scale and counters
    step-00000050/COMMITTED                              written by rank 0 after every rank has saved:
                                                          JSON with the step, stage, world size and
                                                          each rank file's SHA-256

A crash mid-save leaves a directory without COMMITTED, which `latest()` ignores, so a restarted gang
resumes from the newest complete checkpoint. A committed checkpoint whose files no longer match their
digests (a torn copy, bit rot, a truncated volume) is refused by `check()`; `resume.resume_newest`
then falls back to the previous good one. With the same world size and stage each rank reads only
its own file; with another world size or stage every rank reads all files and takes its ranges
(`reshard`). The model and its units must be the same. The compute parameters are then rebuilt from
the masters exactly as after an optimizer step. The directory must be shared by all ranks (rank 0
writes the marker after a collective that proves every rank's file is written).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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


def committed(root: str | Path) -> list[Path]:
    """Committed checkpoints under `root`, oldest first."""
    return sorted(p.parent for p in Path(root).glob(f"step-*/{COMMITTED}"))


def latest(root: str | Path) -> Path | None:
    """The newest committed checkpoint under `root`, or None."""
    done = committed(root)
    return done[-1] if done else None


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_marker(path: Path) -> dict[str, Any]:
    """The COMMITTED marker's record (step, stage, world_size, files: name -> SHA-256)."""
    return dict(json.loads((path / COMMITTED).read_text()))


def check(engine: ZeroEngine, path: str | Path) -> str | None:
    """Why this rank cannot load `path` (a missing or altered file it needs), or None if it can.

    Local only: each rank hashes just the files it will read (its own at the same layout, all of them
    when resharding), so the cost is spread like the checkpoint itself.
    """
    path = Path(path)
    try:
        marker = read_marker(path)
        files: dict[str, str] = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {COMMITTED} marker ({e})"
    same = marker.get("world_size") == engine.world_size and marker.get("stage") == int(engine.config.stage)
    needed = [rank_file(engine.rank)] if same else sorted(files)
    for name in needed:
        f = path / name
        if name not in files or not f.is_file():
            return f"{name} is missing"
        if _sha256(f) != files[name]:
            return f"{name} does not match the SHA-256 recorded when it was committed"
    return None


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` committed checkpoints, and abandoned saves older than the newest.

    Rank 0 only, after a commit; returns what it deleted.
    """
    done = committed(root)
    if not done:
        return []
    newest = done[-1].name
    doomed = done[:-keep_last] + [
        p for p in Path(root).glob("step-*") if p.is_dir() and not (p / COMMITTED).exists() and p.name < newest
    ]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _units(engine: ZeroEngine) -> list[tuple[str, int]]:
    return [(u.name, u.layout.numel) for u in engine.units]


def _layout(engine: ZeroEngine) -> dict[str, Any]:
    return {"stage": int(engine.config.stage), "world_size": engine.world_size, "units": _units(engine)}


def save(engine: ZeroEngine, root: str | os.PathLike[str]) -> Path:
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
    final = target / rank_file(engine.rank)
    tmp = final.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    tmp.rename(final)
    # Gathering every rank's digest also proves every file is in place: only then may the marker exist.
    mine = torch.frombuffer(bytearray.fromhex(_sha256(final)), dtype=torch.uint8).to(engine.units[0].master.device)
    digests = torch.empty(32 * engine.world_size, dtype=torch.uint8, device=mine.device)
    engine.comm.all_gather(digests, mine, "<checkpoint>")
    if engine.rank == 0:
        raw = digests.cpu().tolist()
        files = {rank_file(r): bytes(raw[32 * r : 32 * (r + 1)]).hex() for r in range(engine.world_size)}
        marker = {"step": engine.steps, "stage": int(engine.config.stage), "world_size": engine.world_size}
        (target / f"{COMMITTED}.tmp").write_text(json.dumps({**marker, "files": files}, indent=1) + "\n")
        (target / f"{COMMITTED}.tmp").rename(target / COMMITTED)
    return target


def rank_file_bytes(path: str | os.PathLike[str], rank: int) -> int:
    """Size of `rank`'s file in checkpoint `path` (0 if it has none)."""
    f = Path(path) / rank_file(rank)
    return f.stat().st_size if f.exists() else 0


def load(engine: ZeroEngine, path: str | os.PathLike[str]) -> int:
    """Restore this rank's shard from a committed checkpoint directory; a collective on every rank.

    Returns the bytes this rank read: its own file, or every rank's when resharding.
    """
    path = Path(path)
    if not (path / COMMITTED).exists():
        raise ZeroSetupError("checkpoint", str(path), "not a committed checkpoint", "pass a directory latest() returns")
    mine = path / rank_file(engine.rank)
    state = torch.load(mine, map_location=engine.units[0].master.device) if mine.exists() else None
    if state is not None and state["layout"] == _layout(engine):
        read = rank_file_bytes(path, engine.rank)
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
        read = sum(f.stat().st_size for f in path.glob("rank-*.pt"))
    engine.scaler.scale = state["scaler"]["scale"]
    engine.scaler.skipped_steps = state["scaler"]["skipped"]
    engine.steps, engine.micro_steps = state["steps"], state["micro_steps"]
    for u in engine.units:
        engine.strategy.after_step(u)
    return read
