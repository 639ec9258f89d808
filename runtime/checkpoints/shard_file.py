"""One rank's checkpoint file: safetensors tensors plus a JSON record, written durably and read by range.

safetensors rather than pickles: the header says where every tensor's bytes sit, so a rank loading at another
world size reads only the element ranges it needs (through the library's memory-mapped slices), in bounded
chunks, straight into its own buffers; nothing is unpickled, so a checkpoint can hold no code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

RECORD_KEY = "zerotrain"
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# Elements copied per read: 16 MiB of fp32. Bounds the transient memory of a streaming load.
READ_CHUNK_ELEMENTS = 4 << 20


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
    """Write tensors and the record to `path` via a temporary name, fsynced, then renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(cpu, str(tmp), metadata={RECORD_KEY: json.dumps(record)})
    fsync_path(tmp)
    tmp.rename(path)
    fsync_path(path.parent)


class ShardFileError(Exception):
    """A rank file that cannot be read as a checkpoint shard."""


@dataclass
class ReadStats:
    """What a load read: bytes in total and the largest single read held at once."""

    bytes_read: int = 0
    largest_read_bytes: int = 0


class ShardReader:
    """A rank file opened for range reads; the record is parsed from the header alone."""

    def __init__(self, path: Path, stats: ReadStats | None = None) -> None:
        self.path = path
        self.stats = stats if stats is not None else ReadStats()
        try:
            self._file = safe_open(str(path), framework="pt", device="cpu")
            self.record: dict[str, Any] = json.loads((self._file.metadata() or {})[RECORD_KEY])
        except (OSError, SafetensorError, KeyError, ValueError) as e:
            raise ShardFileError(f"{path.name}: not a readable zerotrain shard ({e})") from None
        self.names = set(self._file.keys())

    def shape(self, name: str) -> list[int]:
        return list(self._file.get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        return DTYPES[self._file.get_slice(name).get_dtype()]

    def tensor(self, name: str) -> torch.Tensor:
        """A whole (small) tensor: RNG states, 0-dim optimizer scalars."""
        t = self._file.get_tensor(name)
        self._count(t)
        return t

    def read_into(self, name: str, src_lo: int, out: torch.Tensor) -> None:
        """Copy elements [src_lo, src_lo + out.numel()) of 1-D tensor `name` into `out`, chunk by chunk."""
        sl = self._file.get_slice(name)
        done = 0
        while done < out.numel():
            n = min(READ_CHUNK_ELEMENTS, out.numel() - done)
            chunk = sl[src_lo + done : src_lo + done + n]
            out[done : done + n].copy_(chunk)
            self._count(chunk)
            done += n

    def _count(self, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        self.stats.bytes_read += nbytes
        self.stats.largest_read_bytes = max(self.stats.largest_read_bytes, nbytes)
