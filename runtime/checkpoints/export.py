"""Reading a sharded checkpoint without an engine: inspect it, or export the model for the rest of the ecosystem.

- safetensors: the consolidated fp32 weights under the model's own parameter names, each tied parameter once
  (its other names recorded in the header's metadata as `aliases`), and the model's persistent buffers in their own
  dtypes (rank 0's): what `model.load_state_dict(..., strict=True)` takes, tied names aside. Streamed: the header
  is computed from the commit marker, then each tensor is assembled from the rank files' ranges and written before
  the next is read, so memory stays near the largest tensor.
- DCP: a `torch.distributed.checkpoint` directory of {"model": the unflattened state dict} (and, with the
  optimizer, {"optim": FQN-keyed state, as torch.distributed.checkpoint.state_dict lays it out}), which
  `dcp.load` reads into a plain model or an FSDP2-wrapped one at any world size. Tied parameters appear under
  every name, and the persistent buffers beside them, as a module's `state_dict()` lists them. DCP writes from one state
  dict, so this export holds the model (and optimizer state) in memory once.

A checkpoint that refers to its frozen base instead of holding it (`base`: a LoRA job's) is exported with the base's
tensors read from the base weights, which the caller opens (and checks against the recorded digest).
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from zerotrain.runtime.checkpoints import base as base_ref
from zerotrain.runtime.checkpoints import checkpoint, reshard
from zerotrain.runtime.checkpoints.model_record import buffer_file, read_buffers
from zerotrain.runtime.checkpoints.shard_file import DTYPES, ShardFileError, ShardReader
from zerotrain.runtime.zero.engine_errors import ZeroSetupError


@dataclass(frozen=True)
class Param:
    """One saved parameter: where it sits in its unit."""

    name: str
    unit: int
    shape: tuple[int, ...]
    offset: int
    kind: int
    """ParamClass: 0 weight-decayed, 1 not decayed, 2 frozen."""

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


class StoredTensors(Protocol):
    """Tensors by name, readable by flattened element range (pretrained weights: `construction.weight_files`)."""

    def read_into(self, name: str, a: int, b: int, out: torch.Tensor) -> None:
        """Elements [a, b) of tensor `name`, flattened row-major, converted into `out`."""
        ...


@dataclass
class Opened:
    """A committed checkpoint opened for reading, its digests verified."""

    path: Path
    marker: dict[str, Any]
    readers: list[ShardReader]
    params: list[Param]
    buffers: dict[str, torch.Tensor]
    """The model's persistent buffers (rank 0's), by name; empty for a checkpoint saved before they were kept."""
    left_out: set[int] = field(default_factory=set)
    """Units the checkpoint does not hold: frozen, read from the base it refers to (`base`)."""
    base: StoredTensors | None = None
    """The base weights those units are read from."""

    @property
    def reference(self) -> base_ref.BaseReference | None:
        return base_ref.BaseReference.of(self.marker.get("origin"))


def base_needed(path: str | os.PathLike[str]) -> base_ref.BaseReference | None:
    """The frozen base the newest checkpoint at `path` leaves out, or None when it holds the whole model."""
    marker = checkpoint.read_marker(checkpoint.resolve(path))
    return (
        base_ref.BaseReference.of(marker.get("origin"))
        if base_ref.left_out(marker["model"], marker.get("origin"))
        else None
    )


def open_checkpoint(path: str | os.PathLike[str], base: StoredTensors | None = None, whole: bool = True) -> Opened:
    """The committed checkpoint at `path` (or the newest under a root), every file verified against its digest; its
    left-out frozen units read from `base`. Refused when it leaves some out and no base is given, unless the caller
    reads no more than what the checkpoint holds (`whole` False)."""
    target = checkpoint.resolve(path)
    marker = checkpoint.read_marker(target)
    bad = checkpoint.unverified(target, marker["files"], marker["files"])
    if bad is not None:
        raise ZeroSetupError("checkpoint", str(target / bad[0]), bad[1], "export a complete, intact checkpoint")
    try:
        readers = [ShardReader(target / n) for n in sorted(marker["files"])]
    except ShardFileError as e:
        raise ZeroSetupError("checkpoint", str(target), str(e), "export an intact checkpoint") from None
    params = [
        Param(p[0], ui, tuple(p[1]), p[2], p[3]) for ui, unit in enumerate(marker["model"]) for p in unit["params"]
    ]
    buffers = read_buffers(readers[buffer_file(readers, 0)]) if marker.get("buffers") else {}
    left_out = base_ref.left_out(marker["model"], marker.get("origin"))
    opened = Opened(target, marker, readers, params, buffers, left_out, base)
    if left_out and base is None and whole:
        ref = opened.reference
        assert ref is not None
        raise ZeroSetupError(
            "--base",
            ref.path,
            f"checkpoint {target} holds the trained parameters only; its frozen ones are the base it was trained on "
            f"(digest {ref.digest}), which is needed for this export",
            "pass --base with the base's path, or export the adapters alone (--format peft)",
        )
    return opened


def read_range(ck: Opened, p: Param, lo: int, hi: int) -> torch.Tensor:
    """Elements [lo, hi) of one parameter's flattened fp32 values, from the rank files that hold them, or from the
    base for a unit the checkpoint leaves out."""
    if p.unit in ck.left_out:
        assert ck.base is not None and ck.reference is not None
        out = torch.empty(hi - lo, dtype=torch.float32)
        ck.base.read_into(ck.reference.names[p.name], lo, hi, out)
        return out
    sources = reshard.master_sources(ck.readers, range(len(ck.readers)), p.unit)
    return reshard.read_range(ck.readers, sources, p.offset + lo, p.offset + hi, p.name)


def read_param(ck: Opened, p: Param) -> torch.Tensor:
    """One parameter's fp32 values, assembled from the rank files that hold its range (or the base)."""
    return read_range(ck, p, 0, p.numel).view(p.shape)


SAFETENSORS_DTYPES = {torch_dtype: name for name, torch_dtype in DTYPES.items()}
"""torch dtype -> the safetensors header's name for it."""


def _header(ck: Opened) -> bytes:
    entries: dict[str, Any] = {}
    offset = 0
    for p in ck.params:
        entries[p.name] = {"dtype": "F32", "shape": list(p.shape), "data_offsets": [offset, offset + 4 * p.numel]}
        offset += 4 * p.numel
    for name, b in ck.buffers.items():
        size = b.numel() * b.element_size()
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[b.dtype],
            "shape": list(b.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    metadata = {
        "format": "pt",
        "aliases": json.dumps(ck.marker.get("aliases", {})),
        "step": str(ck.marker["step"]),
    }
    raw = json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def export_safetensors(
    path: str | os.PathLike[str], out: Path, force: bool = False, base: StoredTensors | None = None
) -> Path:
    """Write the consolidated weights to `out`, tensor by tensor (through a temporary name)."""
    _refuse_existing(out, force)
    ck = open_checkpoint(path, base)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(_header(ck))
        for p in ck.params:
            f.write(read_param(ck, p).numpy().tobytes())
        for b in ck.buffers.values():
            f.write(tensor_bytes(b))
    tmp.rename(out)
    return out


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A CPU tensor's raw little-endian bytes, whatever its dtype (numpy has no bf16: viewed as bytes first)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _optimizer_entries(ck: Opened) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """Per-parameter optimizer state (FQN -> key -> tensor) for every parameter the optimizer updated."""
    saved = reshard.optimizer_sources(ck.readers, range(len(ck.readers)))
    scalars = {k: v for k, v in saved.scalar_values(ck.readers).items() if isinstance(v, torch.Tensor)}
    for p in ck.params:
        keys = sorted(k for (u, k), srcs in saved.elements.items() if u == p.unit and _covers(srcs, p))
        if not keys:
            continue  # frozen: the optimizer never held it
        entry = {k: v.clone() for k, v in scalars.items()}
        for key in keys:
            values = reshard.read_range(ck.readers, saved.elements[(p.unit, key)], p.offset, p.offset + p.numel, p.name)
            entry[key] = values.view(p.shape)
        yield p.name, entry


def _covers(sources: list[reshard.Source], p: Param) -> bool:
    return any(s.lo <= p.offset < s.hi for s in sources)


def export_dcp(
    path: str | os.PathLike[str],
    out: Path,
    optimizer: bool = False,
    force: bool = False,
    base: StoredTensors | None = None,
) -> Path:
    """Write a torch.distributed.checkpoint directory of the unflattened model (and optimizer state)."""
    import torch.distributed.checkpoint as dcp

    _refuse_existing(out, force)
    ck = open_checkpoint(path, base)
    model = {p.name: read_param(ck, p) for p in ck.params}
    # A module's state_dict (plain or FSDP2) lists a tied parameter under every name: so does this one.
    model |= {alias: model[owner] for alias, owner in ck.marker.get("aliases", {}).items()}
    model |= ck.buffers
    state: dict[str, Any] = {"model": model}
    if optimizer:
        state["optim"] = optimizer_state_dict(ck)
    with warnings.catch_warnings():
        # no_dist is the point here: one process writes the whole state, which DCP warns about.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(out), no_dist=True)
    return out


def optimizer_state_dict(ck: Opened) -> dict[str, Any]:
    """Optimizer state keyed by parameter name, with param groups listing names: the layout of
    `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`. Groups follow the weight-decay classes."""
    state = dict(_optimizer_entries(ck))
    kinds = {p.name: p.kind for p in ck.params}
    present = sorted({kinds[n] for n in state})
    # A rank whose shard met every class present has one group per class, in class order.
    saved = next(
        (r.record["param_groups"] for r in ck.readers if len(r.record["param_groups"]) == len(present)),
        [ck.readers[0].record["param_groups"][0]] * len(present),
    )
    groups = []
    for i, kind in enumerate(present):
        hyper = saved[i]
        groups.append({**hyper, "params": [n for n in state if kinds[n] == kind]})
    return {"state": state, "param_groups": groups}


def _refuse_existing(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise ZeroSetupError("--out", str(out), "already exists", "choose another path or pass --force to replace it")


def inspect(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One row per checkpoint directory at `path` (a root, or one checkpoint): position, layout, sizes, and
    whether it is complete (committed, every file present and matching its digest)."""
    root = Path(path)
    if not root.is_dir():
        fix = "pass a checkpoint root or one step-* directory"
        raise ZeroSetupError("checkpoint", str(root), "is not a directory", fix)
    dirs = [root] if root.name.startswith("step-") else sorted(root.glob("step-*"), key=checkpoint.step_of)
    if not dirs:
        raise ZeroSetupError(
            "checkpoint", str(root), "holds no step-* checkpoint directories", "pass the --checkpoint-dir of a run"
        )
    return [_row(d) for d in dirs]


def _row(d: Path) -> dict[str, Any]:
    files = {f.name: f.stat().st_size for f in sorted(d.glob("rank-*.safetensors"))}
    row: dict[str, Any] = {"path": str(d), "step": checkpoint.step_of(d), "bytes_per_rank": files}
    if not (d / checkpoint.COMMITTED).is_file():
        return {**row, "complete": False, "problem": "no COMMITTED marker: a save that did not finish"}
    try:
        marker = checkpoint.read_marker(d)
    except (OSError, ValueError) as e:
        return {**row, "complete": False, "problem": f"unreadable {checkpoint.COMMITTED} marker ({e})"}
    bad = checkpoint.unverified(d, marker["files"], marker["files"])
    row |= {
        "step": marker.get("step"),
        "micro_batches": marker.get("micro_batches"),
        "samples": marker.get("samples"),
        "optimizer_steps": marker.get("optimizer_steps"),
        "world_size": marker.get("world_size"),
        "stage": marker.get("stage"),
        "precision": marker.get("precision"),
        "parameters": sum(int(torch.Size(p[1]).numel()) for u in marker.get("model", []) for p in u["params"]),
        "digests_verified": bad is None,
        "complete": bad is None,
    }
    if bad is not None:
        row["problem"] = f"{bad[0]} is missing or does not match its SHA-256"
    return row
