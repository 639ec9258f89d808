"""Text documents for `zerotrain data prepare --format text`: read, tokenized a bounded batch at a time, split.

A text file is one document; a .jsonl line is one (its text under --text-field). Documents are tokenized with the
`tokenizers` library without the tokenizer's special-token template, the end-of-text id after each, into train.bin
or val.bin (document i held out when i mod stride == 1; a single document is split by its tokens instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from zerotrain.data_files import DTYPE_LIMITS, NUMPY_DTYPES
from zerotrain.errors import UserError

# Documents tokenized together: encode_batch runs on every core, and memory stays bounded.
BATCH_DOCUMENTS = 512
BATCH_CHARS = 8_000_000


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


def split_single_document(stage: Path, writer: Writer, fraction: float) -> None:
    """One text document: its last `fraction` of tokens held out (at least one), the rest trains."""
    import numpy as np

    train, val = writer.splits["train"], writer.splits["val"]
    ids = np.fromfile(stage / "train.bin", dtype=NUMPY_DTYPES[writer.dtype])
    held = max(1, round(len(ids) * fraction)) if len(ids) > 1 else 0
    ids[: len(ids) - held].tofile(stage / "train.bin")
    ids[len(ids) - held :].tofile(stage / "val.bin")
    train.tokens, val.tokens = len(ids) - held, held
    val.documents = 1 if held else 0
