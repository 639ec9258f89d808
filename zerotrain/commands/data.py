"""`zerotrain data prepare INPUT... --tokenizer tokenizer.json --out DIR`: tokenize a corpus into flat binaries.

`--format text` (the default): inputs are text files (one document per file: .txt, .py, anything but .jsonl) and
JSON-lines files (.jsonl: one document per line, its text under --text-field); globs are expanded, each sorted, in
the order given. Documents are tokenized with the `tokenizers` library a bounded batch at a time (never the whole
corpus in memory), without the tokenizer's own special-token template, and with its end-of-text id appended after
every document (--no-eos leaves it out). DIR/train.bin and DIR/val.bin are flat little-endian uint16 or uint32
token ids, what `zerotrain.runtime.job.token_data.TokenFiles` reads; DIR/meta.json records the dtype, the
vocabulary size, the token and document counts, the tokenizer and the EOS id.

`--format chat` and `--format prompt-completion`: inputs are records (JSON Lines, JSON, Parquet), rendered and
masked as `records` says; `--format preference`: pairs of a chosen and a rejected answer, each pair two records one
after the other in one split (`preference_records`), meta.json counting the pairs too. Each split is three files:
`train.bin` (the token ids, records one after another), `train.mask` (one byte a token: 1 where the loss counts it,
the answers) and `train.idx` (int64: where each record starts, and the end), what
`zerotrain.runtime.job.record_data` reads, packed or padded to seq_len as the job's manifest says. meta.json adds
the format, the record counts, what was skipped and why, the longest record and the 99th percentile of lengths, and
the tokenizer's digest (and its chat template's), which the Hugging Face entry point checks against the model's own
tokenizer.

The held-out split is deterministic and needs no count in advance: with stride s = round(1 / val-fraction) (at least
2), document (or record, or pair) i (0-based, in input order) goes to val when i mod s == 1. So 1, 1+s, 1+2s, … are held
out: ≈ val-fraction of them, at least one whenever there are two or more, never the first, and the same on every
run. A single text document (one file) is split by its tokens instead: its last val-fraction of tokens are held
out. --val-fraction 0 holds out nothing. Empty documents are skipped and not counted.

Everything is written in a directory beside DIR's files and moved into place when complete, meta.json last (an
old one is removed first): an interrupted run leaves no file that looks complete.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from zerotrain.commands.documents import Split, Writer, split_single_document, tokenize
from zerotrain.commands.preference_records import Preference
from zerotrain.commands.records import (
    Chat,
    Encoder,
    PromptCompletion,
    RecordFormat,
    RecordSplit,
    RecordWriter,
    named,
    read_records,
    stats,
    template_digest,
)
from zerotrain.data_files import DTYPE_LIMITS, META_FILE, SUFFIXES, tokenizer_digest
from zerotrain.errors import UserError

# Special tokens that end a document in common tokenizers (GPT-2/Qwen, Llama 3, Llama 2/Mistral/T5, Gemma).
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="prepare tokenized training data", description=__doc__)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser(
        "prepare", help="tokenize text or JSON-lines files into train.bin/val.bin", description=__doc__
    )
    r.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="text or .jsonl files (records: .jsonl, .json, .parquet), or globs"
    )
    r.add_argument(
        "--format",
        choices=[f.value for f in RecordFormat],
        default=RecordFormat.TEXT.value,
        help="text (documents, all tokens count), chat (messages through the tokenizer's chat template, the "
        "assistant's tokens count) or prompt-completion (the completion's tokens count); default text",
    )
    r.add_argument(
        "--max-skipped",
        type=float,
        default=0.01,
        help="records: refuse when more than this fraction were skipped (empty answers, a template that cannot mark "
        "them; default 0.01)",
    )
    r.add_argument(
        "--tokenizer",
        required=True,
        help="a tokenizers tokenizer.json (e.g. a Hugging Face model's; --format chat: its chat template beside it)",
    )
    r.add_argument("--out", required=True, help="the directory to write train.bin, val.bin and meta.json to")
    r.add_argument("--val-fraction", type=float, default=0.01, help="documents held out for val.bin (default 0.01)")
    r.add_argument(
        "--dtype",
        choices=["auto", *DTYPE_LIMITS],
        default="auto",
        help="token id width (default auto: uint16 for vocabularies up to 65,536, else uint32)",
    )
    r.add_argument("--text-field", default="text", help="the key holding a .jsonl line's text (default text)")
    r.add_argument(
        "--eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="append the tokenizer's end-of-text id after every document, if it has one (default on)",
    )
    r.set_defaults(func=prepare)


def load_tokenizer(path: str) -> Any:
    """The tokenizers Tokenizer in `path`; UserError naming the path and the library's reason."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError(
            "--tokenizer: the tokenizers library is not installed; pip install tokenizers (or zerotrain[hf])"
        ) from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises plain Exception for every failure
        reason = " ".join(str(e).split())
        raise UserError(
            f"--tokenizer: cannot load {path!r} ({reason}); give a tokenizers tokenizer.json, "
            "e.g. the one in a Hugging Face model directory"
        ) from None


def find_eos(tokenizer: Any, path: str) -> int | None:
    """The end-of-text id: tokenizer_config.json's eos_token beside the file if any, else a well-known name."""
    config = Path(path).parent / "tokenizer_config.json"
    names: list[str] = []
    try:
        eos = json.loads(config.read_text()).get("eos_token")
        names.append(eos["content"] if isinstance(eos, dict) else eos)
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass  # no usable config: fall back to the usual names
    for name in [*names, *EOS_NAMES]:
        token_id = tokenizer.token_to_id(name) if isinstance(name, str) else None
        if token_id is not None:
            return int(token_id)
    return None


def choose_dtype(requested: str, vocab_size: int) -> str:
    """uint16 when every id of the vocabulary fits, else uint32; an explicit too-narrow dtype is refused."""
    if requested == "auto":
        return "uint16" if vocab_size <= DTYPE_LIMITS["uint16"] else "uint32"
    if vocab_size > DTYPE_LIMITS[requested]:
        raise UserError(
            f"--dtype: got {requested}, but the tokenizer's vocabulary has {vocab_size:,} ids, more than "
            f"{requested} holds ({DTYPE_LIMITS[requested]:,}); use --dtype uint32 or auto"
        )
    return requested


def val_stride(fraction: float) -> int | None:
    """s of the held-out pattern (document i is held out when i mod s == 1); None holds out nothing."""
    if not 0 <= fraction <= 0.5:
        raise UserError(f"--val-fraction: got {fraction}; use a fraction in [0, 0.5], e.g. 0.01")
    return None if fraction == 0 else max(2, round(1 / fraction))


def expand_inputs(patterns: list[str]) -> list[Path]:
    """The files the arguments name, each glob sorted, in argument order, each file once."""
    files: dict[Path, None] = {}
    for pattern in patterns:
        hits = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        if os.path.isdir(pattern):
            raise UserError(
                f"INPUT: got {pattern!r}, which is a directory; give its files, e.g. "
                f"'{os.path.join(pattern, '**', '*.jsonl')}' (quoted, so zerotrain expands it)"
            )
        if not hits:
            searched = os.path.abspath(os.path.dirname(pattern) or ".")
            raise UserError(
                f"INPUT: got {pattern!r}, which matches no file (searched {searched}); give text or .jsonl files "
                "or a glob such as 'corpus/**/*.jsonl' (quoted)"
            )
        files.update(dict.fromkeys(hits))
    return list(files)


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A directory beside `out`'s files to write into; on success its files replace `out`'s (meta.json last, after
    the old one and companion files of another format are removed), on failure it is removed."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out, prefix=".prepare-"))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if made:  # a failed prepare leaves nothing behind: not even the directory it made
            shutil.rmtree(out, ignore_errors=True)
        raise
    (out / META_FILE).unlink(missing_ok=True)
    for stale in [*out.glob("train.*"), *out.glob("val.*")]:
        if stale.suffix in (".mask", ".idx") and not (stage / stale.name).exists():
            stale.unlink()
    for f in sorted(stage.iterdir()):
        if f.name != META_FILE:
            os.replace(f, out / f.name)
    os.replace(stage / META_FILE, out / META_FILE)
    stage.rmdir()


def write_text(args: argparse.Namespace, inputs: list[Path], stage: Path, tokenizer: Any) -> dict[str, Any]:
    """Documents into stage/{train,val}.bin; meta.json's fields."""
    vocab_size = int(tokenizer.get_vocab_size())
    dtype = choose_dtype(args.dtype, vocab_size)
    eos_id = find_eos(tokenizer, args.tokenizer) if args.eos else None
    single = len(inputs) == 1 and inputs[0].suffix != ".jsonl"
    stride = val_stride(args.val_fraction)
    writer = Writer(tokenizer, dtype, eos_id, None if single else stride)
    with (stage / "train.bin").open("wb") as train, (stage / "val.bin").open("wb") as val:
        writer.splits = {"train": Split(train), "val": Split(val)}
        tokenize(inputs, writer, args.text_field)
    if writer.splits["train"].tokens == 0:
        raise UserError(f"INPUT: got {args.inputs}, but they hold no text to train on; give non-empty documents")
    if single and stride is not None:
        split_single_document(stage, writer, args.val_fraction)
    train_split, val_split = writer.splits["train"], writer.splits["val"]
    return {
        "format": RecordFormat.TEXT.value,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "tokens": {"train": train_split.tokens, "val": val_split.tokens},
        "documents": {"train": train_split.documents, "val": val_split.documents},
        "tokenizer": str(Path(args.tokenizer).resolve()),
        "tokenizer_digest": tokenizer_digest(Path(args.tokenizer)),
        "eos_id": eos_id,
    }


def write_records(
    args: argparse.Namespace, fmt: RecordFormat, inputs: list[Path], stage: Path, tokenizer: Any
) -> dict[str, Any]:
    """Records into stage/{train,val}.{bin,mask,idx}; meta.json's fields."""
    vocab_size = int(tokenizer.get_vocab_size())
    dtype = choose_dtype(args.dtype, vocab_size)
    eos_id = find_eos(tokenizer, args.tokenizer)
    chat = Chat(Path(args.tokenizer)) if fmt is RecordFormat.CHAT else None
    pairs = Preference(tokenizer, eos_id, Path(args.tokenizer)) if fmt is RecordFormat.PREFERENCE else None
    encoder: Encoder = chat or pairs or PromptCompletion(tokenizer, eos_id)
    writer = RecordWriter(encoder, DTYPE_LIMITS[dtype], val_stride(args.val_fraction))
    with ExitStack() as files:
        for name in ("train", "val"):
            tokens, mask, index = (files.enter_context((stage / f"{name}{s}").open("wb")) for s in SUFFIXES.values())
            writer.splits[name] = RecordSplit(tokens, mask, index, dtype)
        for path in inputs:
            for record, where in read_records(path):
                writer.add(record, where)
    writer.check_skipped(args.max_skipped)
    train, val = writer.splits["train"], writer.splits["val"]
    if train.records == 0:
        raise UserError(f"INPUT: got {args.inputs}, but they hold no record to train on; give non-empty records")
    meta: dict[str, Any] = {
        "format": fmt.value,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "tokens": {"train": train.written, "val": val.written},
        "records": {"train": train.records, "val": val.records},
        "skipped": {reason.name.lower(): n for reason, n in writer.skipped.items()},
        "skipped_at": {reason.name.lower(): places for reason, places in writer.skipped_at.items() if places},
        "lengths": stats(train.lengths + val.lengths),
        "tokenizer": str(Path(args.tokenizer).resolve()),
        "tokenizer_digest": tokenizer_digest(Path(args.tokenizer)),
        "chat_template_digest": template_digest(chat or (pairs.chat if pairs is not None else None)),
        "eos_id": eos_id,
    }
    if pairs is not None:  # records 2k and 2k + 1 are pair k's chosen and rejected answers
        meta["pairs"] = {"train": train.records // 2, "val": val.records // 2}
    return meta


def prepare(args: argparse.Namespace) -> int:
    began = time.monotonic()
    fmt = RecordFormat(args.format)
    val_stride(args.val_fraction)
    if not 0 <= args.max_skipped <= 1:
        raise UserError(f"--max-skipped: got {args.max_skipped}; use a fraction in [0, 1], e.g. 0.01")
    tokenizer = load_tokenizer(args.tokenizer)
    inputs = expand_inputs(args.inputs)
    out = Path(args.out)
    with staged(out) as stage:
        if fmt is RecordFormat.TEXT:
            meta = write_text(args, inputs, stage, tokenizer)
        else:
            meta = write_records(args, fmt, inputs, stage, tokenizer)
        (stage / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    Console().print(Text(summary(out, meta, len(inputs), time.monotonic() - began)), soft_wrap=True)
    return 0


def summary(out: Path, meta: dict[str, Any], files: int, seconds: float) -> str:
    tokens = meta["tokens"]
    if meta["format"] == RecordFormat.TEXT.value:
        docs = meta["documents"]
        return (
            f"wrote {out}: {tokens['train']:,} train / {tokens['val']:,} val tokens ({docs['train']:,} / "
            f"{docs['val']:,} documents) from {files} files, {meta['dtype']}, in {seconds:.1f} s"
        )
    records, skipped = meta.get("pairs") or meta["records"], sum(meta["skipped"].values())
    unit = "pairs" if "pairs" in meta else "records"
    places = meta.get("skipped_at", {})
    why = (
        ", ".join(
            f"{n:,} {k.replace('_', ' ')}: {named(places.get(k, []), n)}" for k, n in meta["skipped"].items() if n
        )
        or "none"
    )
    return (
        f"wrote {out}: {records['train']:,} train / {records['val']:,} val {unit} ({tokens['train']:,} / "
        f"{tokens['val']:,} tokens) from {files} files, {meta['format']}, {meta['dtype']}; skipped {skipped:,} "
        f"({why}); longest record {meta['lengths']['longest']:,} tokens, 99% within {meta['lengths']['p99']:,}; in "
        f"{seconds:.1f} s"
    )
