"""Pretrained weights on disk, read by element range: a rank reads only the bytes its own shard needs.

What `spec.model.pretrained.path` may name:

- a directory as Hugging Face writes it: `model.safetensors`, or `model.safetensors.index.json` and the shards its
  `weight_map` names (`model-00001-of-00004.safetensors`, ...), in any floating dtype;
- one `.safetensors` file (a zerotrain export);
- a zerotrain checkpoint: its root (the newest committed checkpoint) or one `step-*` directory; only its weights
  (and buffers) are read, not its optimizer state or position.

safetensors keeps each tensor's bytes contiguous and row-major after a JSON header, so elements [a, b) of a tensor
are one byte range: it is read with `readinto`, chunk by chunk (`READ_CHUNK_BYTES`), and converted into the fp32
destination. Nothing is memory-mapped whole and no tensor is read whole unless the rank's range covers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from zerotrain.runtime.checkpoints import checkpoint, reshard
from zerotrain.runtime.checkpoints.model_record import read_buffers
from zerotrain.runtime.checkpoints.shard_file import DTYPES as SHARD_DTYPES
from zerotrain.runtime.checkpoints.shard_file import ReadStats, ShardFileError, ShardReader
from zerotrain.weights_layout import Entry, Kind, WeightsError, layout

READ_CHUNK_BYTES = 16 << 20
"""At most this many bytes are read at once: with the rank's shard, the load's whole memory."""
TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class WeightStore(Protocol):
    """Stored tensors by name, readable by flattened element range."""

    entries: dict[str, Entry]
    stats: ReadStats

    def read_into(self, name: str, a: int, b: int, out: torch.Tensor) -> None:
        """Elements [a, b) of tensor `name`, flattened row-major, converted into `out` (b - a elements)."""
        ...


@dataclass
class SafetensorsFiles:
    """One safetensors file, or the shards a Hugging Face index names."""

    entries: dict[str, Entry]
    stats: ReadStats = field(default_factory=ReadStats)

    def read_into(self, name: str, a: int, b: int, out: torch.Tensor) -> None:
        entry = self.entries[name]
        dtype = TORCH_DTYPES[entry.dtype]
        size = torch.empty(0, dtype=dtype).element_size()
        per_chunk = max(1, READ_CHUNK_BYTES // size)
        with entry.file.open("rb", buffering=0) as f:
            for lo in range(a, b, per_chunk):
                hi = min(b, lo + per_chunk)
                buf = bytearray((hi - lo) * size)
                f.seek(entry.start + lo * size)
                if f.readinto(buf) != len(buf):
                    raise WeightsError(str(entry.file), f"ends inside tensor {name!r}", "point at intact weights")
                out[lo - a : hi - a].copy_(torch.frombuffer(buf, dtype=dtype))
                self.stats.bytes_read += len(buf)
                self.stats.largest_read_bytes = max(self.stats.largest_read_bytes, len(buf))


@dataclass
class CheckpointWeights:
    """The weights (and buffers) of a committed zerotrain checkpoint, read from its rank files' ranges."""

    opened: list[ShardReader]
    params: dict[str, tuple[int, int]]
    """Parameter name -> (unit index, offset in the unit)."""
    buffers: dict[str, torch.Tensor]
    entries: dict[str, Entry]
    stats: ReadStats

    def read_into(self, name: str, a: int, b: int, out: torch.Tensor) -> None:
        if name in self.buffers:
            out.copy_(self.buffers[name].reshape(-1)[a:b])
            return
        unit, offset = self.params[name]
        sources = reshard.master_sources(self.opened, range(len(self.opened)), unit)
        target = reshard.TargetPlan(reshard.cover(sources, offset + a, offset + b, offset + b, name), b - a)
        reshard.fill(self.opened, target, out)


def open_weights(path: str | Path) -> WeightStore:
    """The weights at `path` (`zerotrain.weights_layout`), ready to read by range."""
    found = layout(path)
    if found.kind is Kind.CHECKPOINT:
        return _checkpoint(found.root)
    return SafetensorsFiles(found.entries)


def _checkpoint(path: Path) -> CheckpointWeights:
    target = path
    marker = checkpoint.read_marker(target)
    stats = ReadStats()
    try:
        opened = [ShardReader(target / n, stats) for n in sorted(marker["files"])]
    except ShardFileError as e:
        raise WeightsError(str(target), str(e), "point at an intact checkpoint") from None
    params, entries = {}, {}
    for ui, unit in enumerate(marker["model"]):
        for name, shape, offset, _ in unit["params"]:
            params[name] = (ui, offset)
            entries[name] = Entry(target, "F32", tuple(shape), 0)
    buffers: dict[str, torch.Tensor] = {}
    if marker.get("buffers"):
        rank0 = next(r for r in opened if r.record["rank"] == 0)
        buffers = read_buffers(rank0)
        dtypes = {v: k for k, v in SHARD_DTYPES.items()}
        entries |= {n: Entry(target, dtypes[b.dtype], tuple(b.shape), 0) for n, b in buffers.items()}
    return CheckpointWeights(opened, params, buffers, entries, stats)
