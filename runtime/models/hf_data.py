"""The Hugging Face entry point's data: token files (a stream of documents) or instruction records, opened and
checked before the model is built.

Token files (`zerotrain data prepare`, text) give windows of `seq_len + 1` tokens, every token counted. Records
(`--format chat` or `prompt-completion`) give rows as `record_data` builds them, padded or packed (`packing`), the
loss over the answers' tokens (`loss_on: answers`, or `all`), weighed alike across ranks and accumulation (the loss is
a `LossSum`). Both splits must be of one kind. Refused before the model is built, naming the field, the value and the
fix: records cut to seq_len beyond `max_truncated` of them; data tokenized by another tokenizer than the one beside
the model's config (meta.json records its digest); a vocabulary larger than the model's; packing where records are
not packed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from zerotrain.data_files import tokenizer_digest
from zerotrain.runtime.job.record_data import EvalRecordBatches, LossOn, RecordBatches, RecordFiles, Rows, is_records
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.token_data import EvalTokenBatches, TokenBatches, TokenFiles

FIELD = "spec.entrypointArgs"
DEFAULT_MAX_TRUNCATED = 0.05
"""Records a seq_len may cut, at most, unless entrypointArgs.max_truncated says otherwise."""
TOKENIZER = "tokenizer.json"


class NoTrainingData:
    """The batches of a task built without `train`: the model can be built and evaluated, but not trained."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        raise ConfigError(
            f"{FIELD}.train: not set, so the task has no training data; point it at token files or records "
            "(a path, e.g. data/train.bin, as zerotrain data prepare writes them)"
        )


@dataclass(frozen=True)
class DataArgs:
    """entrypointArgs about the data."""

    train: str | list[str] | None
    eval: str | list[str] | None
    seq_len: int
    batch_size: int
    token_dtype: str = "auto"
    packing: bool = False
    loss_on: str = LossOn.ANSWERS.value
    max_truncated: float = DEFAULT_MAX_TRUNCATED


@dataclass
class Data:
    """This rank's batches, opened."""

    batches: TokenBatches | RecordBatches | NoTrainingData
    evaluation: EvalTokenBatches | EvalRecordBatches | None
    records: bool
    notes: list[str] = field(default_factory=list)
    """What validate says of the data beyond its size (records cut to seq_len)."""


def _kind(args: DataArgs) -> bool:
    """Whether the data are records (both splits must agree)."""
    splits = (("train", args.train), ("eval", args.eval))
    kinds = {name: is_records(path) for name, path in splits if isinstance(path, str)}
    if len(set(kinds.values())) > 1:
        records = next(k for k, v in kinds.items() if v)
        other = "eval" if records == "train" else "train"
        problem = f"records, but {FIELD}.{other} is token files"
        raise ConfigError(f"{FIELD}.{records}: {problem}; give both splits of one prepare")
    return any(kinds.values())


def _check_options(args: DataArgs, records: bool) -> LossOn:
    if args.loss_on not in [v.value for v in LossOn]:
        raise ConfigError(f"{FIELD}.loss_on: got {args.loss_on!r}; use answers (the default) or all")
    if not 0 <= args.max_truncated <= 1:
        raise ConfigError(f"{FIELD}.max_truncated: got {args.max_truncated}; use a fraction in [0, 1], e.g. 0.05")
    if not records and (args.packing or args.loss_on != LossOn.ANSWERS.value):
        set_ = "packing" if args.packing else "loss_on"
        raise ConfigError(
            f"{FIELD}.{set_}: set, but the data are token files (one stream of documents, already packed, every token "
            "counted); it applies to records (zerotrain data prepare --format chat or prompt-completion)"
        )
    return LossOn(args.loss_on)


def check_tokenizer(files: RecordFiles | TokenFiles, model_dir: Path | None, field_name: str) -> None:
    """The data's tokenizer (its digest in meta.json) against the tokenizer beside the model's config, if any."""
    meta = files.meta or {}
    recorded = meta.get("tokenizer_digest")
    if model_dir is None or recorded is None or not (model_dir / TOKENIZER).is_file():
        return
    own = tokenizer_digest(model_dir / TOKENIZER)
    if own != recorded:
        raise ConfigError(
            f"{FIELD}.{field_name}: prepared with the tokenizer {meta.get('tokenizer')} (digest {recorded}), but the "
            f"model's is {model_dir / TOKENIZER} (digest {own}); prepare the data again with --tokenizer "
            f"{model_dir / TOKENIZER}"
        )


def _check_records(files: RecordFiles, args: DataArgs, loss_on: LossOn, vocab: int | None, name: str) -> str:
    if vocab is not None and int(files.meta.get("vocab_size", 0)) > vocab:
        raise ConfigError(
            f"{FIELD}.{name}: prepared with a vocabulary of {files.meta['vocab_size']:,} ids, more than the model's "
            f"{vocab:,}; prepare it with the model's tokenizer, or fix the config's vocab_size"
        )
    width = args.seq_len + 1
    lengths = files.lengths
    cut = int((lengths > width).sum())
    emptied = int((files.counted(width, loss_on) == 0).sum())
    if cut and cut / len(files) > args.max_truncated:
        wanted = int(np.percentile(lengths, 99)) - 1
        share = f"{cut:,} of {len(files):,} records of {name} ({cut / len(files):.1%})"
        lost = f"{emptied:,} losing every answer token; the longest has {int(lengths.max()):,}"
        raise ConfigError(
            f"{FIELD}.seq_len: got {args.seq_len}, but {share} are longer than its {width} tokens and would be cut "
            f"({lost}); use seq_len {wanted} or more (99% of records fit), or allow it with max_truncated (now "
            f"{args.max_truncated})"
        )
    return f"{name}: {len(files):,} records, {cut:,} cut to seq_len ({emptied:,} losing every answer token)"


def open_data(args: DataArgs, rank: int, world_size: int, vocab: int | None, model_dir: Path | None) -> Data:
    """This rank's training batches (drawn in the order of the seed the runtime set) and evaluation batches."""
    records = _kind(args)
    loss_on = _check_options(args, records)
    if records:
        return _open_records(
            args, Rows(args.seq_len, args.batch_size, rank, world_size, args.packing, loss_on), vocab, model_dir
        )
    data = Data(NoTrainingData(), None, records)
    shape = {"seq_len": args.seq_len, "batch_size": args.batch_size, "rank": rank, "world_size": world_size}
    if args.train is not None:
        files = TokenFiles(args.train, dtype=args.token_dtype, field=f"{FIELD}.train")
        check_tokenizer(files, model_dir, "train")
        data.batches = TokenBatches(files, **shape, seed=torch.initial_seed(), vocab_size=vocab)
    if args.eval is not None:
        files = TokenFiles(args.eval, dtype=args.token_dtype, field=f"{FIELD}.eval")
        data.evaluation = EvalTokenBatches(files, **shape, vocab_size=vocab)
    return data


def _open_records(args: DataArgs, rows: Rows, vocab: int | None, model_dir: Path | None) -> Data:
    data = Data(NoTrainingData(), None, True)
    for name, path in (("train", args.train), ("eval", args.eval)):
        if path is None:
            continue
        if not isinstance(path, str):
            raise ConfigError(f"{FIELD}.{name}: got {path!r}; records are one prepared split: give its .bin path")
        split = RecordFiles(path, f"{FIELD}.{name}")
        check_tokenizer(split, model_dir, name)
        data.notes.append(_check_records(split, args, rows.loss_on, vocab, name))
        if name == "train":
            data.batches = RecordBatches(split, rows, seed=torch.initial_seed())
        else:
            data.evaluation = EvalRecordBatches(split, rows)
    return data


def model_directory(config: object) -> Path | None:
    """The directory of a config given as one (where a model's tokenizer sits beside it)."""
    return Path(config).expanduser() if isinstance(config, str) and Path(config).expanduser().is_dir() else None
