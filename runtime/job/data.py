"""Byte-level text data, split across ranks so that runs at any world size see the same global batches.

The text is the Python standard library's own source, present on every machine with Python: no download,
nothing random. Files are read in sorted order from `sysconfig.get_paths()["stdlib"]` (top level only, so
installed packages never change it) until `max_bytes`.

World-size invariance: global micro-batch k is a pure function of (seed, k, batch_size): `batch_size`
windows at offsets drawn from a generator seeded with (seed, k). Rank r of W takes rows
[r·B/W, (r+1)·B/W) of it. With G gradient-accumulation steps, optimizer step t consumes global micro-batches
t·G … t·G+G-1, so the global batch of step t is the same for W = 1, 2, 4, … and losses are comparable.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

from zerotrain.runtime.job.task import ConfigError

# Distinct streams for distinct seeds without overlap for any realistic number of micro-batches.
_SEED_STRIDE = 1_000_003


def stdlib_dir() -> Path:
    """Directory of the standard library's .py sources of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def read_text_corpus(directory: Path | None = None, max_bytes: int = 2_000_000) -> torch.Tensor:
    """The top-level `*.py` files of `directory` (default: the stdlib), sorted, joined, as a uint8 tensor."""
    root = directory if directory is not None else stdlib_dir()
    if max_bytes < 1:
        raise ConfigError(f"spec.entrypointArgs.max_bytes: got {max_bytes}; must be positive; use e.g. 2000000")
    try:
        files = sorted(p for p in root.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError as e:
        raise ConfigError(
            f"spec.entrypointArgs.text_dir: cannot list {str(root)!r} ({e.strerror}); "
            "point it at a directory of .py files"
        ) from None
    chunks: list[bytes] = []
    size = 0
    for path in files:
        if size >= max_bytes:
            break
        chunk = path.read_bytes() + b"\n"
        chunks.append(chunk)
        size += len(chunk)
    if size == 0:
        raise ConfigError(
            f"spec.entrypointArgs.text_dir: no .py source files in {str(root)!r} (an image without stdlib sources?); "
            "point text_dir at a directory of .py files"
        )
    data = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def rank_rows(rows: int, rank: int, world_size: int, field: str = "spec.entrypointArgs.batch_size") -> slice:
    """Rows [r·B/W, (r+1)·B/W) of a global batch of `rows`; B must divide evenly so every rank's share is equal."""
    if rows % world_size != 0:
        raise ConfigError(
            f"{field}: got {rows}, which {world_size} ranks cannot split evenly; "
            f"use a multiple of the world size (e.g. {max(world_size, rows - rows % world_size)})"
        )
    per_rank = rows // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class WindowStream:
    """Iterating yields this rank's rows of global micro-batch 0, 1, 2, … (`global_batch`), each a pure function of
    (seed, index, batch_size); the position is the micro-batches drawn, which checkpoints hold. The text and token
    file sources differ only in where a window's ids come from."""

    seed: int
    batch_size: int
    rows: slice
    """This rank's rows of every global micro-batch."""
    index: int = 0
    """Global micro-batches drawn so far (the same at every world size)."""

    def global_batch(self, index: int, rows: slice = slice(None)) -> torch.Tensor:
        raise NotImplementedError

    def window_starts(self, index: int, high: int, rows: slice) -> torch.Tensor:
        """Rows `rows` of global micro-batch `index`'s window offsets in [0, high)."""
        gen = torch.Generator().manual_seed(self.seed * _SEED_STRIDE + index)
        # Every rank draws all B offsets so the stream does not depend on the world size.
        return torch.randint(0, high, (self.batch_size,), generator=gen)[rows]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        batch = self.global_batch(self.index, self.rows)
        self.index += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        """The data position: global micro-batches drawn so far (the same at every world size)."""
        return {"micro_batches": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at micro-batch `state["micro_batches"]`; no batch before it is drawn."""
        self.index = int(state["micro_batches"])


class TextBatches(WindowStream):
    """Global micro-batches of byte windows; iterating yields this rank's rows of micro-batch 0, 1, 2, …

    Each row holds `seq_len + 1` bytes (as int64 token ids): inputs are the first `seq_len`, targets the last.
    """

    def __init__(
        self, data: torch.Tensor, *, seq_len: int, batch_size: int, rank: int, world_size: int, seed: int = 0
    ) -> None:
        if seq_len < 1:
            raise ConfigError(f"spec.entrypointArgs.seq_len: got {seq_len}; must be at least 1; use e.g. 128")
        if data.numel() < seq_len + 2:
            raise ConfigError(
                f"spec.entrypointArgs.seq_len: got {seq_len}, but the text has only {data.numel()} bytes; "
                "use a shorter seq_len or a larger max_bytes"
            )
        self.data = data
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.rows = rank_rows(batch_size, rank, world_size)
        self.index = 0

    def global_batch(self, index: int, rows: slice = slice(None)) -> torch.Tensor:
        """Rows `rows` (default all) of global micro-batch `index`, shape (rows, seq_len + 1), int64."""
        starts = self.window_starts(index, self.data.numel() - self.seq_len - 1, rows)
        window = torch.arange(self.seq_len + 1)
        return self.data[starts[:, None] + window[None, :]].long()


class HeldOutBatches:
    """Evaluation micro-batches of held-out text: calling it gives a fresh iterator over this rank's rows of global
    micro-batch 0, 1, … where micro-batch j holds the consecutive windows j·B … (j+1)·B − 1 of `seq_len + 1` bytes
    from the start of `data`: the same batches every call, and at every world size."""

    def __init__(self, data: torch.Tensor, *, seq_len: int, batch_size: int, rank: int, world_size: int) -> None:
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.rows = rank_rows(batch_size, rank, world_size)
        self.micro_batches = data.numel() // ((seq_len + 1) * batch_size)
        """Whole global micro-batches the held-out text holds."""

    def __call__(self) -> Iterator[torch.Tensor]:
        width = self.seq_len + 1
        for j in range(self.micro_batches):
            rows = torch.arange(j * self.batch_size, (j + 1) * self.batch_size)[self.rows]
            yield self.data[rows[:, None] * width + torch.arange(width)[None, :]].long()
