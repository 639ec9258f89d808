"""Tokenized data from flat binaries (nanoGPT / Megatron style), split across ranks like `runtime.job.data`.

A token file is a flat little-endian array of uint16 or uint32 token ids, e.g. the train.bin / val.bin that
`zerotrain data prepare` writes (with a meta.json beside them naming the dtype and the vocabulary size). Files
are opened with `numpy.memmap` and only the windows a batch needs are read, so a corpus of any size costs no
memory beyond the page cache. Several files (paths or globs, sorted) form one concatenated stream; a window may
cross a file boundary.

`TokenBatches` keeps `TextBatches`' contract: global micro-batch k is a pure function of (seed, k, batch_size),
every rank draws all offsets and keeps its rows, so the global batch of a step does not depend on the world size,
elastic gangs (`SlotBatches`) can ask for any rows of any micro-batch, and checkpoints record one number.
`EvalTokenBatches` walks consecutive non-overlapping windows from the start, the same on every call.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zerotrain.runtime.job.data import WindowStream, rank_rows
from zerotrain.runtime.job.task import ConfigError

# Explicitly little-endian: the files are the same bytes on every machine.
DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
META_FILE = "meta.json"


def _match(patterns: list[str], field: str) -> list[Path]:
    """Every regular file the patterns match, sorted and deduplicated; each pattern must match something."""
    found: set[Path] = set()
    for pattern in patterns:
        given = os.path.expanduser(pattern)
        # The working directory is a literal prefix: a "[" in its name must not turn into a glob class.
        full = given if os.path.isabs(given) else os.path.join(glob.escape(os.getcwd()), given)
        hits = [Path(p).resolve() for p in glob.glob(full, recursive=True) if os.path.isfile(p)]
        if not hits:
            searched = os.path.dirname(os.path.join(os.getcwd(), given))
            raise ConfigError(
                f"{field}: got {pattern!r}, which matches no file (searched {searched}); fix the path or glob, "
                "or write the files with `zerotrain data prepare`"
            )
        found.update(hits)
    return sorted(found)


def _meta_dtype(paths: list[Path], field: str) -> tuple[str | None, dict[str, Any] | None]:
    """The dtype (and the whole meta.json) recorded beside the files; None when no meta.json is there."""
    metas: dict[Path, dict[str, Any]] = {}
    for meta_path in sorted({p.parent / META_FILE for p in paths}):
        if not meta_path.is_file():
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{field}: {meta_path} is not readable JSON ({e}); write it again with `zerotrain data prepare` "
                "or delete it and give dtype"
            ) from None
        if not isinstance(meta, dict) or meta.get("dtype") not in DTYPES:
            got = meta.get("dtype") if isinstance(meta, dict) else meta
            raise ConfigError(
                f"{field}: {meta_path} gives dtype {got!r}; it must be uint16 or uint32: fix it, or delete it "
                "and give dtype"
            )
        metas[meta_path] = meta
    dtypes = {m["dtype"] for m in metas.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{p} says {m['dtype']}" for p, m in metas.items())
        raise ConfigError(f"{field}: the files' meta.json disagree ({listed}); use files of one dtype")
    if not metas:
        return None, None
    return dtypes.pop(), next(iter(metas.values()))


def _resolve_dtype(paths: list[Path], dtype: str, field: str) -> tuple[str, dict[str, Any] | None]:
    """The files' dtype: the explicit one, else meta.json's, else uint16; refuse a contradiction."""
    if dtype not in (*DTYPES, "auto"):
        raise ConfigError(f"{field}: dtype got {dtype!r}; use uint16, uint32 or auto (meta.json's, else uint16)")
    recorded, meta = _meta_dtype(paths, field)
    if dtype == "auto":
        return recorded or "uint16", meta
    if recorded is not None and recorded != dtype:
        raise ConfigError(
            f"{field}: dtype got {dtype!r}, but meta.json beside the files says {recorded}; "
            f"use dtype {recorded} or auto"
        )
    return dtype, meta


class TokenFiles:
    """Token files as one stream: `len(files)` tokens, `read(start, stop)` any range of them."""

    def __init__(
        self, pattern: str | list[str], *, dtype: str = "auto", field: str = "spec.entrypointArgs.train"
    ) -> None:
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        if not patterns:
            raise ConfigError(f"{field}: got no paths; give a token file or glob, e.g. data/train.bin")
        self.field = field
        self.paths = _match(patterns, field)
        """Every matched file, sorted (empty ones included)."""
        # `meta` is the meta.json beside the files (vocab_size, tokenizer, ...), None when there is none.
        self.dtype, self.meta = _resolve_dtype(self.paths, dtype, field)
        np_dtype = DTYPES[self.dtype]
        self.maps: list[np.memmap] = []
        """One read-only map per non-empty file (an empty file cannot be mapped and adds no tokens)."""
        self.mapped: list[Path] = []
        self.starts: list[int] = [0]
        """starts[i]: the stream offset of mapped[i]'s first token; starts[-1] is the total."""
        for path in self.paths:
            size = path.stat().st_size
            self._check_size(path, size)
            if size == 0:
                continue
            self.maps.append(np.memmap(path, dtype=np_dtype, mode="r"))
            self.mapped.append(path)
            self.starts.append(self.starts[-1] + size // np_dtype.itemsize)
        if self.starts[-1] == 0:
            raise ConfigError(
                f"{field}: got {pattern!r}, but its {len(self.paths)} file(s) hold no tokens; "
                "point it at prepared data (zerotrain data prepare)"
            )

    def _check_size(self, path: Path, size: int) -> None:
        itemsize = DTYPES[self.dtype].itemsize
        if size % itemsize == 0:
            return
        other = "uint16" if self.dtype == "uint32" else "uint32"
        fix = (
            f"if it holds {other} ids, set dtype {other}; otherwise it was cut short (an interrupted write): "
            "prepare it again"
        )
        if size % DTYPES[other].itemsize != 0:
            fix = "it was cut short (an interrupted write) or is not a token file: prepare it again"
        raise ConfigError(
            f"{self.field}: {path} holds {size} bytes, not a whole number of {self.dtype} ids "
            f"({itemsize} bytes each); {fix}"
        )

    def __len__(self) -> int:
        return self.starts[-1]

    @property
    def num_tokens(self) -> int:
        """Tokens in all files together."""
        return self.starts[-1]

    def locate(self, offset: int) -> tuple[Path, int]:
        """(file, token offset inside it) of stream offset `offset`."""
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.mapped[i], offset - self.starts[i]

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Tokens [start, stop) of the stream as int64, reading only those bytes (across file boundaries)."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"tokens [{start}, {stop}) are outside the stream of {len(self)}")
        pieces = []
        i = bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            end = min(stop, self.starts[i + 1])
            local = start - self.starts[i]
            pieces.append(np.asarray(self.maps[i][local : local + end - start], dtype=np.int64))
            start, i = end, i + 1
        flat = pieces[0] if len(pieces) == 1 else np.concatenate(pieces or [np.empty(0, np.int64)])
        return torch.from_numpy(flat)


def _check_shape(files: TokenFiles, seq_len: int, batch_size: int, need: int, fix: str) -> None:
    """Refuse a window or batch the data cannot hold: `need` tokens must be there."""
    if batch_size < 1:
        raise ConfigError(f"spec.entrypointArgs.batch_size: got {batch_size}; must be at least 1; use e.g. 8")
    if seq_len < 1:
        raise ConfigError(f"spec.entrypointArgs.seq_len: got {seq_len}; must be at least 1; use e.g. 1024")
    if len(files) < need:
        raise ConfigError(
            f"spec.entrypointArgs.seq_len: got {seq_len}, but {files.field} holds only {len(files)} tokens "
            f"({need} needed); use {fix} or more data"
        )


def _check_vocab(files: TokenFiles, batch: torch.Tensor, starts: list[int], vocab_size: int | None) -> None:
    """Refuse a batch holding an id the model has no embedding for (a CUDA gather would assert, unreadably)."""
    if vocab_size is None or batch.numel() == 0:
        return
    bad = (batch >= vocab_size).nonzero()
    if len(bad) == 0:
        return
    row, col = (int(x) for x in bad[0])
    path, at = files.locate(starts[row] + col)
    raise ConfigError(
        f"{files.field}: token id {int(batch[row, col])} at token {at} of {path} is outside the model's "
        f"vocabulary of {vocab_size} (spec.entrypointArgs.vocab_size); the tokenizer and the model config "
        "disagree: prepare the data again with the model's tokenizer, or fix vocab_size"
    )


def _check_vocab_size(vocab_size: int | None) -> None:
    if vocab_size is not None and vocab_size < 1:
        raise ConfigError(f"spec.entrypointArgs.vocab_size: got {vocab_size}; must be positive; use the tokenizer's")


class TokenBatches(WindowStream):
    """Global micro-batches of token windows; iterating yields this rank's rows of micro-batch 0, 1, 2, …

    Each row holds `seq_len + 1` token ids (int64): inputs are the first `seq_len`, targets the last.
    """

    def __init__(
        self,
        files: TokenFiles,
        *,
        seq_len: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        _check_shape(files, seq_len, batch_size, seq_len + 1, "a shorter seq_len")
        _check_vocab_size(vocab_size)
        self.files = files
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.vocab_size = vocab_size
        self.rows = rank_rows(batch_size, rank, world_size)
        self.index = 0

    def global_batch(self, index: int, rows: slice = slice(None)) -> torch.Tensor:
        """Rows `rows` (default all) of global micro-batch `index`, shape (rows, seq_len + 1), int64."""
        starts = self.window_starts(index, len(self.files) - self.seq_len, rows).tolist()
        if not starts:
            return torch.empty((0, self.seq_len + 1), dtype=torch.int64)
        batch = torch.stack([self.files.read(s, s + self.seq_len + 1) for s in starts])
        _check_vocab(self.files, batch, starts, self.vocab_size)
        return batch


class EvalTokenBatches:
    """Calling it gives a fresh iterator over this rank's rows of the evaluation micro-batches.

    Window w is tokens [w·(seq_len+1), (w+1)·(seq_len+1)); global micro-batch j is windows j·B … (j+1)·B-1, so the
    set is the same at every world size and on every call. `micro_batches` full micro-batches fit the data.
    """

    def __init__(
        self,
        files: TokenFiles,
        *,
        seq_len: int,
        batch_size: int,
        rank: int,
        world_size: int,
        vocab_size: int | None = None,
    ) -> None:
        # One full micro-batch at least: an evaluation that runs no batch would report nothing, silently.
        _check_shape(files, seq_len, batch_size, batch_size * (seq_len + 1), "a shorter seq_len, a smaller batch_size")
        self.rows = rank_rows(batch_size, rank, world_size)
        _check_vocab_size(vocab_size)
        self.files = files
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.micro_batches = len(files) // (seq_len + 1) // batch_size
        """Full global micro-batches in the data; a partial last one is left out so every batch has B rows."""

    def __len__(self) -> int:
        return self.micro_batches

    def describe(self) -> str:
        """Why it holds as many micro-batches as it does, in the data's terms."""
        width = self.seq_len + 1
        return (
            f"its {len(self.files):,} held-out tokens make {len(self.files) // width:,} windows of seq_len + 1 = "
            f"{width} tokens, {self.micro_batches} full global micro-batch(es) of entrypointArgs.batch_size "
            f"{self.batch_size}"
        )

    def batch(self, index: int) -> torch.Tensor:
        """This rank's rows of evaluation micro-batch `index`, shape (rows, seq_len + 1), int64."""
        width = self.seq_len + 1
        first = index * self.batch_size + self.rows.start
        count = self.rows.stop - self.rows.start
        batch = self.files.read(first * width, (first + count) * width).view(count, width)
        _check_vocab(self.files, batch, [(first + r) * width for r in range(count)], self.vocab_size)
        return batch

    def __call__(self) -> Iterator[torch.Tensor]:
        return (self.batch(j) for j in range(self.micro_batches))
