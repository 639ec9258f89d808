"""`zerotrain data prepare INPUT... --tokenizer tokenizer.json --out DIR`: tokenize a corpus into flat binaries.

Inputs are text files (one document per file: .txt, .py, anything but .jsonl) and JSON-lines files (.jsonl: one
document per line, its text under --text-field); globs are expanded, each sorted, in the order given. Documents
are tokenized with the `tokenizers` library a bounded batch at a time (never the whole corpus in memory), without
the tokenizer's own special-token template, and with its end-of-text id appended after every document (--no-eos
leaves it out). DIR/train.bin and DIR/val.bin are flat little-endian uint16 or uint32 token ids, what
`zerotrain.runtime.job.token_data.TokenFiles` reads; DIR/meta.json records the dtype, the vocabulary size, the
token and document counts, the tokenizer and the EOS id.

The held-out split is deterministic and needs no document count in advance: with stride s = round(1 /
val-fraction) (at least 2), document i (0-based, in input order) goes to val.bin when i mod s == 1. So documents
1, 1+s, 1+2s, … are held out: ≈ val-fraction of them, at least one whenever there are two or more, never the
first, and the same documents on every run. --val-fraction 0 holds out nothing (val.bin is empty). Empty
documents (an empty file, a .jsonl text of "") are skipped and not counted.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from zerotrain.errors import UserError

# Token ids each dtype can hold; the vocabulary decides between them.
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}
# Little-endian on every machine, as TokenFiles reads them.
NUMPY_DTYPES = {"uint16": "<u2", "uint32": "<u4"}
# Special tokens that end a document in common tokenizers (GPT-2/Qwen, Llama 3, Llama 2/Mistral/T5, Gemma).
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
# Documents tokenized together: encode_batch runs on every core, and memory stays bounded.
BATCH_DOCUMENTS = 512
BATCH_CHARS = 8_000_000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="prepare tokenized training data", description=__doc__)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser(
        "prepare", help="tokenize text or JSON-lines files into train.bin/val.bin", description=__doc__
    )
    r.add_argument("inputs", nargs="+", metavar="INPUT", help="text or .jsonl files, or globs of them")
    r.add_argument("--tokenizer", required=True, help="a tokenizers tokenizer.json (e.g. a Hugging Face model's)")
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


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"INPUT: {where} is not UTF-8 text (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
            "convert it to UTF-8 or leave it out"
        ) from None


def documents(path: Path, text_field: str) -> Iterator[tuple[str, str, int]]:
    """(text, location for messages, bytes read) of each document in `path`, one at a time."""
    if path.suffix != ".jsonl":
        raw = path.read_bytes()
        yield _decode(raw, str(path)), str(path), len(raw)
        return
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            line = _decode(raw, where)
            if not line.strip():
                yield "", where, len(raw)  # a blank line (e.g. a trailing one) is no document
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise UserError(f"INPUT: {where} is not JSON ({e}); make every line one JSON object") from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                found = "is not a string" if isinstance(record, dict) and text_field in record else "is missing"
                raise UserError(
                    f"--text-field: got {text_field!r}, but it {found} in {where}; "
                    "name the key that holds each line's text"
                )
            yield text, where, len(raw)


@dataclass
class Split:
    """One output file being written: train.bin or val.bin."""

    handle: IO[bytes]
    tokens: int = 0
    documents: int = 0


@dataclass
class Writer:
    """Tokenizes batches of documents into the two splits, checking every id fits the dtype."""

    tokenizer: Any
    dtype: str
    eos_id: int | None
    stride: int | None
    splits: dict[str, Split] = field(default_factory=dict)
    index: int = 0
    """Documents seen so far, in input order: the held-out pattern counts these."""

    def write(self, batch: list[tuple[str, str]]) -> int:
        """Tokenize and write `batch` of (text, location); the tokens written."""
        import numpy as np

        encoded = self.tokenizer.encode_batch([text for text, _ in batch], add_special_tokens=False)
        written = 0
        for (_, where), encoding in zip(batch, encoded, strict=True):
            ids = list(encoding.ids) + ([self.eos_id] if self.eos_id is not None else [])
            held_out = self.stride is not None and self.index % self.stride == 1
            self.index += 1
            if ids and max(ids) >= DTYPE_LIMITS[self.dtype]:
                raise UserError(
                    f"--dtype: got {self.dtype}, but {where} has token id {max(ids)}, beyond its range "
                    f"(< {DTYPE_LIMITS[self.dtype]:,}); use --dtype uint32"
                )
            split = self.splits["val" if held_out else "train"]
            split.handle.write(np.asarray(ids, dtype=NUMPY_DTYPES[self.dtype]).tobytes())
            split.tokens += len(ids)
            split.documents += 1
            written += len(ids)
        return written


def _progress() -> Progress:
    console = Console(stderr=True)
    # A bar redrawn into a log file or pipe is noise: show it on a terminal only.
    return Progress(
        TextColumn("[bold]tokenizing"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[files]} files, {task.fields[documents]:,} documents, {task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def tokenize(inputs: list[Path], writer: Writer, text_field: str) -> None:
    """Stream every document of `inputs` through `writer`, with a progress bar on stderr."""
    total = sum(p.stat().st_size for p in inputs)
    with _progress() as progress:
        task = progress.add_task("tokenizing", total=total or 1, files=0, documents=0, tokens=0)
        tokens = 0
        for number, path in enumerate(inputs, start=1):
            batch: list[tuple[str, str]] = []
            chars = read = 0
            for text, where, size in documents(path, text_field):
                read += size
                if text:
                    batch.append((text, where))
                    chars += len(text)
                if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                    tokens += writer.write(batch)
                    progress.update(task, advance=read, documents=writer.index, tokens=tokens)
                    batch, chars, read = [], 0, 0
            tokens += writer.write(batch) if batch else 0
            progress.update(task, advance=read, files=number, documents=writer.index, tokens=tokens)


def prepare(args: argparse.Namespace) -> int:
    began = time.monotonic()
    stride = val_stride(args.val_fraction)
    tokenizer = load_tokenizer(args.tokenizer)
    vocab_size = int(tokenizer.get_vocab_size())
    dtype = choose_dtype(args.dtype, vocab_size)
    eos_id = find_eos(tokenizer, args.tokenizer) if args.eos else None
    inputs = expand_inputs(args.inputs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    writer = Writer(tokenizer, dtype, eos_id, stride)
    # Written under a temporary name and renamed at the end: a failed run leaves no plausible-looking train.bin.
    partial = {name: out / f"{name}.bin.partial" for name in ("train", "val")}
    try:
        with partial["train"].open("wb") as train, partial["val"].open("wb") as val:
            writer.splits = {"train": Split(train), "val": Split(val)}
            tokenize(inputs, writer, args.text_field)
        if writer.splits["train"].tokens == 0:
            raise UserError(f"INPUT: got {args.inputs}, but they hold no text to train on; give non-empty documents")
    except BaseException:
        for path in partial.values():
            path.unlink(missing_ok=True)
        raise
    for name, path in partial.items():
        path.replace(out / f"{name}.bin")
    train_split, val_split = writer.splits["train"], writer.splits["val"]
    meta = {
        "dtype": dtype,
        "vocab_size": vocab_size,
        "tokens": {"train": train_split.tokens, "val": val_split.tokens},
        "documents": {"train": train_split.documents, "val": val_split.documents},
        "tokenizer": str(Path(args.tokenizer).resolve()),
        "eos_id": eos_id,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    seconds = time.monotonic() - began
    Console().print(
        Text(
            f"wrote {out}: {train_split.tokens:,} train / {val_split.tokens:,} val tokens "
            f"({train_split.documents:,} / {val_split.documents:,} documents) from {len(inputs)} files, "
            f"{dtype}, in {seconds:.1f} s"
        ),
        soft_wrap=True,
    )
    return 0
