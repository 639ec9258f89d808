"""Sharded checkpoints: every rank saves what only it holds; a commit marker, written last, makes one valid.

Layout under the checkpoint root:

    step-00000050-3f9a1c07/rank-00000.safetensors ...   each rank's fp32 master shards, optimizer state, RNG
                                                        states, and the model's persistent buffers (rank 0's
                                                        file; every rank's without zero.broadcastBuffers); its
                                                        JSON record (ranges, position, loss scaler) sits in the
                                                        safetensors header
    step-00000050-3f9a1c07/COMMITTED                    written by rank 0 after every rank's file is fsynced:
                                                        step, stage, world size, the model's parameter and
                                                        buffer names and shapes, each file's SHA-256 and size

Every save goes to a fresh directory (the step, then a token drawn by rank 0), so a committed checkpoint is never
rewritten. Files and directories are fsynced before the marker is renamed into place; a crash before that leaves a
directory without COMMITTED, which `committed()` ignores. A committed checkpoint whose files no longer match their
digests is refused (`prepare`), and `Checkpointer.resume` falls back to the previous good one. Loading (`load`)
works at any world size and stage for the same model: each rank plans which byte ranges of which files fill its
shard (`reshard`), verifies those files, agrees with every other rank that all can load, and only then reads. On
any refusal the engine is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zerotrain.runtime.checkpoints import base, rank_state, reshard
from zerotrain.runtime.checkpoints.model_record import (
    BUFFER_PREFIX,
    buffer_difference,
    buffer_file,
    model_difference,
    rank_file,
    read_buffers,
)
from zerotrain.runtime.checkpoints.shard_file import ReadStats, ShardFileError, ShardReader, fsync_path, write
from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.engine_state import Checkpointable, EngineState, ShardLayout

log = logging.getLogger(__name__)

COMMITTED = "COMMITTED"
FORMAT = 2
_DIGEST = 32


def step_of(path: Path) -> int:
    """The step in a checkpoint directory's name (`step-00000050-<token>`)."""
    return int(path.name.split("-")[1])


def committed(root: str | Path) -> list[Path]:
    """Committed checkpoints under `root`, oldest first (by step, then by commit time)."""
    found = [p.parent for p in Path(root).glob(f"step-*/{COMMITTED}")]
    return sorted(found, key=lambda p: (step_of(p), (p / COMMITTED).stat().st_mtime_ns, p.name))


def latest(root: str | Path) -> Path | None:
    """The newest committed checkpoint under `root`, or None."""
    done = committed(root)
    return done[-1] if done else None


def resolve(path: str | os.PathLike[str]) -> Path:
    """`path` itself when it is a committed checkpoint, else the newest one under it (a checkpoint root)."""
    p = Path(path)
    if (p / COMMITTED).is_file():
        return p
    newest = latest(p) if p.is_dir() else None
    if newest is None:
        raise ZeroSetupError(
            "checkpoint",
            str(p),
            "neither a committed checkpoint (no COMMITTED marker) nor a directory holding one",
            "pass a checkpoint root (the --checkpoint-dir of a run) or one of its step-* directories",
        )
    return newest


def read_marker(path: Path) -> dict[str, Any]:
    """The COMMITTED marker's record (see the module docstring)."""
    return dict(json.loads((path / COMMITTED).read_text()))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unverified(path: Path, digests: dict[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    """The first of `names` in checkpoint `path` that is missing or no longer matches its committed digest:
    (name, what is wrong), or None when all verify."""
    for name in sorted(names):
        if not (path / name).is_file():
            return name, "is missing"
        if sha256(path / name) != digests[name]:
            return name, "does not match the SHA-256 recorded when it was committed"
    return None


def _optimizer_record(optimizer: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer `state_dict()` as a rank file holds it: its tensors by `optim.<param>.<key>`, the rest as JSON."""
    tensors: dict[str, torch.Tensor] = {}
    keys: dict[str, list[str]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in optimizer["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = value
                keys.setdefault(str(idx), []).append(key)
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = [
        {
            k: v
            for k, v in g.items()
            if k != "params" and isinstance(v, (int, float, bool, str, tuple, list, type(None)))
        }
        for g in optimizer["param_groups"]
    ]
    return tensors, {"optimizer_keys": keys, "optimizer_scalars": scalars, "param_groups": groups}


def save(engine: Checkpointable, root: str | os.PathLike[str], origin: dict[str, Any] | None = None) -> Path:
    """Save and commit this rank's shard of the training state in a fresh directory; a collective on every rank.
    `origin` says where the model's weights first came from (`{"pretrained": path}`, for an export's config) and
    which frozen base the checkpoint refers to instead of holding it (`base.BaseReference`)."""
    state = engine.state_dict()
    target, pos = begin(engine, state, root)
    tensors, record = rank_contents(state, origin)
    commit(engine, target, pos, write_rank(target, state.layout.rank, tensors, record), origin)
    return target


def begin(engine: Checkpointable, state: EngineState, root: str | os.PathLike[str]) -> tuple[Path, dict[str, int]]:
    """The fresh directory of this save (the same on every rank: a collective) and the position it records."""
    token = torch.tensor(
        [secrets.randbits(31) if state.layout.rank == 0 else 0], dtype=torch.int64, device=engine.device
    )
    engine.comm.all_reduce(token, "<checkpoint>")  # every rank now names the same fresh directory
    pos = state.position.record()
    target = Path(root) / f"step-{pos['step']:08d}-{int(token.item()):08x}"
    target.mkdir(parents=True, exist_ok=True)  # the token, drawn fresh, keeps it apart from every earlier save
    return target, pos


def rank_contents(
    state: EngineState, origin: dict[str, Any] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What this rank's file holds: its tensors (the state's own, views of the engine's buffers: copy them before
    the next step changes them) and its JSON record; frozen units the base `origin` refers to are left out. No
    collective."""
    layout = state.layout
    tensors, rank_record = rank_state.capture(state)
    if layout.holds_model_states:
        opt_tensors, opt_record = _optimizer_record(state.optimizer)
        tensors.update(opt_tensors)
        skip = base.left_out(layout, origin)
        tensors.update({f"master.{i}": m for i, m in enumerate(state.masters) if i not in skip})
        ranges = [[u.master_range[0]] * 2 if i in skip else list(u.master_range) for i, u in enumerate(layout.units)]
        segments = [list(s) for s in layout.optimizer_segments]
    else:
        # Hybrid sharding: the other shard groups hold the same bytes as the first; their files keep only what is
        # each rank's own (randomness, counters), so a checkpoint is one copy of the model states, as at N = S.
        _, opt_record = _optimizer_record({"state": {}, "param_groups": state.optimizer["param_groups"]})
        ranges, segments = [[0, 0] for _ in layout.units], []
    if layout.saves_buffers and state.buffers is not None:
        tensors.update({BUFFER_PREFIX + n: t for n, t in state.buffers.items()})
    record = {
        "format": FORMAT,
        "rank": layout.rank,
        "world_size": layout.world_size,
        "shard_group_size": layout.shard_group_size,
        "stage": int(layout.stage),
        "master_ranges": ranges,
        "optimizer_segments": segments,
        **opt_record,
        **rank_record,
    }
    return tensors, record


def write_rank(target: Path, rank: int, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> bytes:
    """Write and fsync one rank's file; its digest and size, as `commit` gathers them. No collective: a background
    writer may run it."""
    final = target / rank_file(rank)
    write(final, tensors, record)
    return bytes.fromhex(sha256(final)) + struct.pack("<q", final.stat().st_size)


def commit(
    engine: Checkpointable, target: Path, pos: dict[str, int], mine: bytes, origin: dict[str, Any] | None = None
) -> None:
    """Gather every rank's digest and size (which also proves every file is durable: only then may the marker
    exist) and write the marker from rank 0; a collective on every rank."""
    # The checkpoint's collectives run on the ranks' device: NCCL takes no host tensors (and an offloaded master is
    # on the host).
    layout = engine.layout
    gathered = torch.empty(len(mine) * layout.world_size, dtype=torch.uint8, device=engine.device)
    engine.comm.all_gather(
        gathered, torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(engine.device), "<checkpoint>"
    )
    if layout.rank == 0:
        _commit(layout, target, bytes(gathered.cpu().tolist()), pos, origin or {})


def _commit(layout: ShardLayout, target: Path, raw: bytes, pos: dict[str, int], origin: dict[str, Any]) -> None:
    size = _DIGEST + 8
    files, sizes = {}, {}
    for r in range(layout.world_size):
        rec = raw[size * r : size * (r + 1)]
        files[rank_file(r)] = rec[:_DIGEST].hex()
        sizes[rank_file(r)] = struct.unpack("<q", rec[_DIGEST:])[0]
    marker = {
        "format": FORMAT,
        **pos,
        "stage": int(layout.stage),
        "world_size": layout.world_size,
        "precision": layout.precision.value,
        "model": layout.model_record(),
        "buffers": layout.buffer_record(),
        "broadcast_buffers": layout.broadcast_buffers,
        "aliases": layout.aliases,
        "origin": origin,
        "files": files,
        "file_bytes": sizes,
    }
    tmp = target / f"{COMMITTED}.tmp"
    tmp.write_text(json.dumps(marker, indent=1) + "\n")
    fsync_path(tmp)
    fsync_path(target)
    tmp.rename(target / COMMITTED)
    fsync_path(target)


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` committed checkpoints, and abandoned saves older than the newest.

    Rank 0 only, after a commit; the marker goes first, so a prune cut short leaves no committed checkpoint with
    missing files. Returns what it deleted.
    """
    done = committed(root)
    if not done:
        return []
    newest = step_of(done[-1])
    abandoned = [
        p for p in Path(root).glob("step-*") if p.is_dir() and not (p / COMMITTED).exists() and step_of(p) < newest
    ]
    doomed = done[:-keep_last] + abandoned
    for p in doomed:
        (p / COMMITTED).unlink(missing_ok=True)
        shutil.rmtree(p, ignore_errors=True)
    return doomed


@dataclass
class Prepared:
    """A checkpoint this rank has verified and planned, ready to read."""

    path: Path
    marker: dict[str, Any]
    readers: list[ShardReader]
    plan: reshard.LoadPlan
    stats: ReadStats
    buffers: int | None = None
    """The file this rank restores the model's buffers from (its own, else rank 0's); None when the checkpoint
    predates saving them."""


@dataclass(frozen=True)
class Loaded:
    """What `load` did on this rank."""

    path: Path
    """The checkpoint directory loaded."""
    step: int
    """Training steps done (applied or skipped): the loop continues at step + 1."""
    bytes_read: int
    """Bytes this rank read (its own ranges, not the whole checkpoint)."""
    largest_read_bytes: int
    """The largest single read held at once: the transient memory of the load beyond the engine's own buffers."""


def prepare(engine: Checkpointable, path: Path) -> Prepared | str:
    """Open, compare, plan and verify `path` for this rank; why it cannot load it, or what to read."""
    layout = engine.layout
    try:
        marker = read_marker(path)
        files: dict[str, str] = marker["files"]
        if marker.get("format") != FORMAT:
            return f"format {marker.get('format', 1)} is not {FORMAT} (saved by another zerotrain version)"
        mine = layout.model_record()
        difference = model_difference(marker["model"], mine)
        difference = difference or buffer_difference(marker.get("buffers"), layout.buffer_record())
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {COMMITTED} marker ({e})"
    if difference is not None:
        return f"saved from another model: {difference}"
    stats = ReadStats()
    missing = sorted(n for n in files if not (path / n).is_file())
    if missing:
        return f"{missing[0]} is missing"
    try:
        readers = [ShardReader(path / name, stats) for name in sorted(files)]
        units = [(u.name, u.extent, u.master_range) for u in layout.units]
        remap = reshard.layout_runs(marker["model"], mine)
        skip = base.left_out(marker["model"], marker.get("origin"))
        plan = reshard.plan_load(readers, layout.rank, units, layout.optimizer_segments, remap, skip)
        buffers = buffer_file(readers, layout.rank) if marker.get("buffers") else None
    except (ShardFileError, reshard.ReshardError, KeyError) as e:
        return str(e)
    # Only the files this rank reads are hashed: the cost is spread like the checkpoint itself.
    reads = plan.files() | ({buffers} if buffers is not None else set())
    bad = unverified(path, files, (readers[f].path.name for f in reads))
    if bad is not None:
        return " ".join(bad)
    return Prepared(path, marker, readers, plan, stats, buffers)


def agree(engine: Checkpointable, mine: Prepared | str) -> str | None:
    """Every rank's verdict: None when all can load, else this rank's reason or how many others refused."""
    refusals = torch.tensor([1.0 if isinstance(mine, str) else 0.0], device=engine.device)
    engine.comm.all_reduce(refusals, "<checkpoint>")
    if isinstance(mine, str):
        return mine
    return None if refusals.item() == 0 else f"{int(refusals.item())} other rank(s) could not verify their files"


def apply(engine: Checkpointable, ready: Prepared) -> Loaded:
    """Read the planned ranges into the engine (every rank agreed it can): into its state's own tensors, in place,
    then `load_state_dict`, which rebuilds the compute parameters."""
    readers, plan = ready.readers, ready.plan
    state = engine.state_dict()
    with torch.no_grad():
        for index, master in enumerate(state.masters):
            target = plan.masters[index]
            if target is not None:  # None: a frozen unit the checkpoint refers to its base for (read as it started)
                reshard.fill(readers, target, master)
    optimizer = state.optimizer
    optimizer["state"] = reshard.optimizer_state(readers, plan, state.masters[0].device)  # beside the master
    saved_groups = readers[0].record["param_groups"]
    if len(saved_groups) == len(optimizer["param_groups"]):
        for group, saved in zip(optimizer["param_groups"], saved_groups, strict=True):
            group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v for k, v in saved.items()})
    state.buffers = read_buffers(readers[ready.buffers]) if ready.buffers is not None else None
    if ready.buffers is None and state.layout.buffers and "buffers" not in ready.marker:
        log.warning(
            "checkpoint %s holds no model buffers (saved before zerotrain kept them): %s keep their initial values",
            ready.path,
            ", ".join(b.name for b in state.layout.buffers),
        )
    own = next((r for r in readers if r.record["rank"] == state.layout.rank), None)
    engine.load_state_dict(rank_state.continued(state, (own or readers[0]).record))
    if own is not None:
        rank_state.restore_rng({n: own.tensor(n) for n in own.names if n.startswith("rng.")}, own.record)
    step = int(ready.marker["step"])
    return Loaded(ready.path, step, ready.stats.bytes_read, ready.stats.largest_read_bytes)


def load(engine: Checkpointable, path: str | os.PathLike[str]) -> Loaded:
    """Load a committed checkpoint, or the newest under a checkpoint root, at any world size or stage.

    A collective on every rank. Raises ZeroSetupError naming the checkpoint and the reason, with the engine
    unchanged, when any rank cannot load it.
    """
    target = resolve(path)
    problem = agree(engine, ready := prepare(engine, target))
    if problem is not None or isinstance(ready, str):
        raise ZeroSetupError(
            "checkpoint", str(target), problem or "refused", "load a complete checkpoint of this model"
        )
    return apply(engine, ready)


def save_checkpoint(engine: Checkpointable, root: str | os.PathLike[str]) -> Path:
    """`zerotrain.runtime.save_checkpoint`: `save`, from a loop of your own (a collective on every rank)."""
    return save(engine, root)


def load_checkpoint(engine: Checkpointable, path: str | os.PathLike[str]) -> Loaded:
    """`zerotrain.runtime.load_checkpoint`: `load`, from a loop of your own."""
    return load(engine, path)
