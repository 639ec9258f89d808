"""Instruction records from `zerotrain data prepare --format chat|prompt-completion`, batched for training.

A split is three memory-mapped files (`train.bin`, `train.mask`, `train.idx`: the records' token ids one after
another, one byte a token saying whether the loss counts it, and where each record starts). A batch row is built in
one of two ways, as the manifest chooses (`entrypointArgs.packing`):

- padded (the default): one record a row, cut to `seq_len + 1` tokens, the rest padding that nothing attends from
  and nothing is predicted at;
- packed: records one after another in a row until the next does not fit (none is split across rows), each starting
  at position 0 again; the model then keeps them apart (transformers builds a block-diagonal causal mask from
  position ids that restart), so no record attends to another, and no label crosses from one to the next.

A row is `input_ids` and `position_ids` (`seq_len` each) and `labels`: the next token where the loss counts it, -100
elsewhere (prompts, padding, record boundaries), already shifted (predicting label i from input i), so the loss
must not shift them again. `loss_on: all` counts every token of a record but its first.

World-size invariance, as `TokenBatches`: every epoch visits the records in a permutation drawn from (seed, epoch);
the rows of an epoch follow it (packed: greedily, in that order), and global micro-batch k is rows k·B … (k+1)·B − 1
of the run's row sequence, of which rank r takes its share. So the global batch of a step does not depend on the
world size, an elastic gang can ask for any rows of any micro-batch, and a checkpoint records one number.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zerotrain.data_files import PAIR_FORMAT, RECORD_FORMATS
from zerotrain.runtime.job.data import WindowStream, rank_rows
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.token_data import DTYPES, META_FILE

IGNORE = -100


class LossOn(str, Enum):
    """Which tokens of a record the loss counts."""

    ANSWERS = "answers"
    """The answers' tokens: what the data's mask marks (assistant turns, completions)."""
    ALL = "all"
    """Every token but the first (the prompt too)."""


def is_records(path: str) -> bool:
    """Whether `path` is a split of records (meta.json beside it says a record format)."""
    meta = Path(path).expanduser().parent / META_FILE
    try:
        return json.loads(meta.read_text()).get("format") in (*RECORD_FORMATS, PAIR_FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


class RecordFiles:
    """One split of records, memory-mapped: `len()` records, each read by index."""

    def __init__(self, path: str, field: str) -> None:
        tokens = Path(path).expanduser()
        self.field, self.path = field, tokens
        try:
            self.meta: dict[str, Any] = json.loads((tokens.parent / META_FILE).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{field}: cannot read {tokens.parent / META_FILE} ({e}); prepare the data again"
            ) from None
        if self.meta.get("format") == PAIR_FORMAT:
            raise ConfigError(
                f"{field}: got {path!r}, prepared with --format preference: pairs of a chosen and a rejected answer, "
                "which supervised fine-tuning would train on both; prepare the records with --format chat or "
                "prompt-completion (preference tuning is not yet a training objective)"
            )
        companions = [tokens.with_suffix(s) for s in (".mask", ".idx")]
        missing = [str(p) for p in [tokens, *companions] if not p.is_file()]
        if missing:
            raise ConfigError(
                f"{field}: got {path!r}, but {', '.join(missing)} is missing; prepare the records again "
                "(zerotrain data prepare --format chat or prompt-completion writes all three)"
            )
        self.tokens = np.memmap(tokens, dtype=DTYPES[self.meta["dtype"]], mode="r")
        self.mask = np.memmap(companions[0], dtype=np.uint8, mode="r")
        self.offsets = np.fromfile(companions[1], dtype="<i8")
        if len(self.offsets) < 2 or self.offsets[-1] != len(self.tokens) or len(self.mask) != len(self.tokens):
            raise ConfigError(
                f"{field}: {tokens}, its .mask and .idx do not agree (an interrupted write?); prepare the data again"
            )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def record(self, i: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Record i's first `limit` token ids and mask."""
        a = int(self.offsets[i])
        b = min(int(self.offsets[i + 1]), a + limit)
        return np.asarray(self.tokens[a:b], dtype=np.int64), np.asarray(self.mask[a:b], dtype=bool)

    def counted(self, limit: int, loss_on: LossOn) -> np.ndarray:
        """Tokens each record's labels count once cut to `limit` tokens (its first token is never a label)."""
        starts, ends = self.offsets[:-1], np.minimum(self.offsets[1:], self.offsets[:-1] + limit)
        if loss_on is LossOn.ALL:
            return np.maximum(ends - starts - 1, 0)
        bounds = np.stack([np.minimum(starts + 1, ends), ends], axis=1).reshape(-1)
        # reduceat sums [bounds[2i], bounds[2i+1]); an empty range gives the element at its start: zeroed below.
        sums = np.add.reduceat(np.append(self.mask, 0), bounds, dtype=np.int64)[0::2]
        return np.where(bounds[1::2] > bounds[0::2], sums, 0)


class RowPlan:
    """Which records make each row, epoch after epoch (see the module): padded, one a row; packed, greedily."""

    def __init__(self, files: RecordFiles, seq_len: int, seed: int, packing: bool, shuffle: bool = True) -> None:
        self.files, self.width, self.seed, self.packing, self.shuffle = files, seq_len + 1, seed, packing, shuffle
        self.lengths = np.minimum(files.lengths, self.width)
        self.epochs: list[list[list[int]]] = []
        self.starts = [0]
        """starts[e]: the first row of epoch e; starts[-1]: the rows of the epochs planned so far."""

    def order(self, epoch: int) -> list[int]:
        n = len(self.files)
        if not self.shuffle:
            return list(range(n))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=gen).tolist()

    def _plan(self, epoch: int) -> list[list[int]]:
        order = self.order(epoch)
        if not self.packing:
            return [[r] for r in order]
        rows: list[list[int]] = [[]]
        used = 0
        for r in order:
            size = int(self.lengths[r])
            if rows[-1] and used + size > self.width:
                rows.append([])
                used = 0
            rows[-1].append(r)
            used += size
        return rows

    def row(self, j: int) -> list[int]:
        """The records of row j of the run."""
        while self.starts[-1] <= j:
            self.epochs.append(self._plan(len(self.epochs)))
            self.starts.append(self.starts[-1] + len(self.epochs[-1]))
        epoch = bisect.bisect_right(self.starts, j) - 1
        return self.epochs[epoch][j - self.starts[epoch]]


def build_row(files: RecordFiles, records: list[int], seq_len: int, loss_on: LossOn, packed: bool, pad: int) -> Any:
    """One row (see the module): input_ids, labels and position_ids of `seq_len` each."""
    width = seq_len + 1
    tokens = np.full(width, pad, dtype=np.int64)
    counted = np.zeros(width, dtype=bool)
    segment = np.full(width, -1, dtype=np.int64)
    positions = np.arange(width, dtype=np.int64)
    cursor = 0
    for k, r in enumerate(records):
        ids, mask = files.record(r, width)
        n = len(ids)
        tokens[cursor : cursor + n], segment[cursor : cursor + n] = ids, k
        counted[cursor : cursor + n] = mask if loss_on is LossOn.ANSWERS else True
        positions[cursor : cursor + n] = np.arange(n)
        cursor += n
    if packed:  # the padding is a record of its own, apart from the others
        positions[cursor:] = np.arange(width - cursor)
    follows = (segment[1:] == segment[:-1]) & (segment[1:] >= 0) & counted[1:]
    labels = np.where(follows, tokens[1:], IGNORE)
    return {
        "input_ids": torch.from_numpy(tokens[:seq_len].copy()),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions[:seq_len].copy()),
    }


def stack(rows: list[Any]) -> Any:
    return {k: torch.stack([r[k] for r in rows]) for k in ("input_ids", "labels", "position_ids")}


@dataclass(frozen=True)
class Rows:
    """How rows are made and shared out: their length, the global micro-batch's rows and this rank's, packed or
    padded, and which tokens count."""

    seq_len: int
    batch_size: int
    rank: int
    world_size: int
    packing: bool = False
    loss_on: LossOn = LossOn.ANSWERS

    @property
    def mine(self) -> slice:
        return rank_rows(self.batch_size, self.rank, self.world_size)

    def build(self, files: RecordFiles, plan: RowPlan, rows: range) -> Any:
        pad = int(files.meta.get("eos_id") or 0)
        return stack([build_row(files, plan.row(j), self.seq_len, self.loss_on, self.packing, pad) for j in rows])


class RecordBatches(WindowStream):
    """Global micro-batches of record rows; iterating yields this rank's rows of micro-batch 0, 1, 2, …"""

    def __init__(self, files: RecordFiles, shape: Rows, seed: int = 0) -> None:
        self.files, self.shape, self.seed = files, shape, seed
        self.seq_len, self.batch_size, self.rows = shape.seq_len, shape.batch_size, shape.mine
        self.plan = RowPlan(files, shape.seq_len, seed, shape.packing)
        self.index = 0
        self._counted: np.ndarray | None = None

    def global_batch(self, index: int, rows: slice = slice(None)) -> Any:
        """Rows `rows` (default all) of global micro-batch `index`: a dict of (rows, seq_len) int64 tensors."""
        first = index * self.batch_size
        return self.shape.build(self.files, self.plan, range(first, first + self.batch_size)[rows])

    def counted(self, index: int) -> int:
        """Tokens the labels of global micro-batch `index` count, over every rank."""
        if self._counted is None:
            self._counted = self.files.counted(self.seq_len + 1, self.shape.loss_on)
        first = index * self.batch_size
        return int(sum(self._counted[r] for j in range(first, first + self.batch_size) for r in self.plan.row(j)))


class EvalRecordBatches:
    """Calling it gives a fresh iterator over this rank's rows of the evaluation micro-batches: the held-out
    records in order, packed or padded as for training, the same on every call and at every world size."""

    def __init__(self, files: RecordFiles, shape: Rows) -> None:
        self.files, self.shape = files, shape
        self.plan = RowPlan(files, shape.seq_len, 0, shape.packing, shuffle=False)
        self.plan.row(0)
        self.micro_batches = len(self.plan.epochs[0]) // shape.batch_size
        """Full micro-batches the held-out records make (a partial last one is left out)."""

    def __len__(self) -> int:
        return self.micro_batches

    def describe(self) -> str:
        """Why it holds as many micro-batches as it does, in the data's terms."""
        rows, shape = len(self.plan.epochs[0]), self.shape
        made = "packed into" if shape.packing else "one a row:"
        return (
            f"its {len(self.files):,} held-out records make {rows:,} rows ({made} seq_len {shape.seq_len}), "
            f"{self.micro_batches} full global micro-batch(es) of entrypointArgs.batch_size {shape.batch_size} "
            f"({len(range(shape.batch_size)[shape.mine])} rows on each of {shape.world_size} ranks)"
        )

    def __call__(self) -> Iterator[Any]:
        b = self.shape.batch_size
        for k in range(self.micro_batches):
            yield self.shape.build(self.files, self.plan, range(k * b, (k + 1) * b)[self.shape.mine])
