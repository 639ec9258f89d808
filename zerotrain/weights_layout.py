"""Where pretrained weights' tensors lie on disk, read from the files' headers alone (no torch): what
`spec.model.pretrained.path` names, checked by `zerotrain validate`, by `zerotrain run` before any rank starts, and
read by the ranks (`zerotrain.runtime.construction.weight_files`).

A path may name a directory as Hugging Face writes it (`model.safetensors`, or `model.safetensors.index.json` and
the shards its `weight_map` names), one `.safetensors` file (a zerotrain export), or a zerotrain checkpoint (its root
or one `step-*` directory). safetensors keeps each tensor's bytes contiguous after a JSON header: `Entry.start` is
where they begin in the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from zerotrain.errors import UserError

FIELD = "spec.model.pretrained.path"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
COMMITTED = "COMMITTED"
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""What a parameter may be stored as: converted exactly into the fp32 master."""
DTYPES = (*FLOAT_DTYPES, "I64", "I32", "I16", "I8", "U8", "BOOL")
"""What zerotrain reads at all (buffers may be integers)."""


class WeightsError(UserError, ValueError):
    """Pretrained weights that cannot be used: the field, the value, what is wrong and the fix."""

    def __init__(self, value: Any, problem: str, fix: str, field: str = FIELD) -> None:
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}: got {value!r}; {problem}; {fix}")


class Kind(str, Enum):
    """How the weights are laid out."""

    SINGLE = "one safetensors file"
    INDEXED = "safetensors shards with an index"
    CHECKPOINT = "a zerotrain checkpoint"


@dataclass(frozen=True)
class Entry:
    """One stored tensor: its file, dtype, shape and the byte where its data begins."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """What a pretrained path holds: its kind, and (for safetensors) every tensor's entry."""

    kind: Kind
    root: Path
    """The file, the directory, or the checkpoint directory itself (a root resolved to its newest)."""
    entries: dict[str, Entry]
    """Every stored tensor (empty for a checkpoint: its marker describes it)."""

    def describe(self) -> str:
        if self.kind is Kind.CHECKPOINT:
            return f"{self.kind.value} ({self.root.name})"
        files = len({e.file for e in self.entries.values()})
        dtypes = sorted({e.dtype for e in self.entries.values()})
        return f"{self.kind.value}: {len(self.entries)} tensors in {files} file(s), {'/'.join(dtypes)}"


def read_header(path: Path) -> dict[str, Entry]:
    """The tensors one safetensors file holds, refused when unreadable or stored in a dtype zerotrain cannot read."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        items = {n: m for n, m in header.items() if n != "__metadata__"}
        out = {n: Entry(path, m["dtype"], tuple(m["shape"]), 8 + size + m["data_offsets"][0]) for n, m in items.items()}
    except (OSError, struct.error, ValueError, KeyError, TypeError) as e:
        raise WeightsError(str(path), f"is not a readable safetensors file ({e})", "point at intact weights") from None
    for name, entry in out.items():
        if entry.dtype not in DTYPES:
            raise WeightsError(
                str(path),
                f"tensor {name!r} is stored as {entry.dtype}, which zerotrain cannot convert",
                f"store the weights in one of {', '.join(DTYPES)} (e.g. re-save them in bf16)",
            )
    return out


def _indexed(directory: Path) -> dict[str, Entry]:
    try:
        weight_map: dict[str, str] = json.loads((directory / INDEX).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WeightsError(
            str(directory / INDEX), f"is not a readable index ({e})", "point at intact weights"
        ) from None
    entries: dict[str, Entry] = {}
    for file in sorted(set(weight_map.values())):
        if not (directory / file).is_file():
            names = sorted(n for n, f in weight_map.items() if f == file)
            raise WeightsError(
                str(directory),
                f"{INDEX} names {file}, which is missing ({len(names)} tensors, e.g. {names[0]})",
                "copy every shard the index names beside it",
            )
        entries |= read_header(directory / file)
    return entries


def _newest_checkpoint(root: Path) -> Path:
    if (root / COMMITTED).is_file():
        return root
    done = sorted(
        root.glob(f"step-*/{COMMITTED}"), key=lambda m: (int(m.parent.name.split("-")[1]), m.stat().st_mtime_ns)
    )
    return done[-1].parent


def layout(path: str | Path) -> Layout:
    """What `path` holds (see the module docstring); WeightsError naming the field, the value and the fix."""
    p = Path(path)
    if not p.exists():
        raise WeightsError(str(p), "does not exist", "point it at a directory of safetensors weights")
    if p.is_file():
        if p.suffix != ".safetensors":
            raise WeightsError(str(p), "is not a .safetensors file", "name a .safetensors file or its directory")
        return Layout(Kind.SINGLE, p, read_header(p))
    if (p / COMMITTED).is_file() or any(p.glob(f"step-*/{COMMITTED}")):
        return Layout(Kind.CHECKPOINT, _newest_checkpoint(p), {})
    if (p / INDEX).is_file():
        return Layout(Kind.INDEXED, p, _indexed(p))
    found = sorted(q.name for q in p.glob("*.safetensors"))
    if (p / SINGLE).is_file() or len(found) == 1:
        return Layout(Kind.SINGLE, p, read_header(p / (SINGLE if (p / SINGLE).is_file() else found[0])))
    several = f"holds several .safetensors files ({', '.join(found[:4])}) but no {INDEX}"
    raise WeightsError(
        str(p),
        f"{several if found else 'holds no safetensors weights'} (nor {SINGLE}, nor a zerotrain checkpoint)",
        f"point it at weights saved as {SINGLE} or with {INDEX}",
    )


SAMPLES = 16
"""Pieces of each weights file a digest reads, spread evenly through its data."""
SAMPLE_BYTES = 1 << 16


def digest(path: str | Path) -> str:
    """A short digest of the weights at `path`: what a LoRA job's checkpoints record of their base, so that a base
    changed since is refused. It covers the index and every file's header and size, and `SAMPLES` pieces of 64 KiB
    spread through each file's data (about 1 MiB a file, whatever its size); a zerotrain checkpoint, the SHA-256 of
    every file its marker records. The same files give the same digest wherever they are."""
    held = layout(path)
    h = hashlib.sha256(held.kind.name.encode())
    if held.kind is Kind.CHECKPOINT:
        files = json.loads((held.root / COMMITTED).read_text()).get("files", {})
        h.update(json.dumps(files, sort_keys=True).encode())
        return h.hexdigest()[:16]
    if held.kind is Kind.INDEXED:
        h.update((held.root / INDEX).read_bytes())
    for file in sorted({e.file for e in held.entries.values()}):
        size = file.stat().st_size
        h.update(f"{file.name}:{size}".encode())
        with file.open("rb") as f:
            (header,) = struct.unpack("<Q", f.read(8))
            h.update(f.read(header))
            data = 8 + header
            span = max(0, size - data - SAMPLE_BYTES)
            for i in range(SAMPLES):
                f.seek(data + span * i // max(1, SAMPLES - 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]
