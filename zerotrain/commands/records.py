"""Instruction records for `zerotrain data prepare --format chat|prompt-completion`: read, rendered, masked.

Records come from JSON Lines, JSON (an array of objects) and Parquet files, read through the `datasets` library one
at a time (streaming: never a whole file in memory, nothing fetched, nothing cached beside the output). Each becomes
token ids and a mask of the tokens the loss counts:

- `prompt-completion`: a record's `prompt` and `completion` strings, each tokenized without special tokens (as
  torchtune tokenizes each message apart), the end-of-text id after the completion; the completion and that id count
  (the model learns where an answer ends), the prompt does not.
- `chat`: a record's `messages`, a list of `{role, content}`, rendered with the tokenizer's own chat template (from
  its tokenizer_config.json or chat_template.jinja). The assistant messages' tokens count, their end-of-turn tokens
  included: where the template marks them (`{% generation %}`), as transformers' `return_assistant_tokens_mask` reads
  them; otherwise from the template itself, by rendering the conversation up to each assistant message with and
  without it (a template that renders an earlier turn differently once a later one follows cannot be masked this
  way: the record is skipped and counted).

Records whose answer has no token (an empty completion, no assistant message) are skipped and counted, as are the
ones a template cannot mask; `prepare` refuses a file set where more than `--max-skipped` of the records were.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from zerotrain.data_files import NUMPY_DTYPES, digest_of
from zerotrain.errors import UserError

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""The `datasets` builder of each record file kind."""
KNOWN_ROLES = ("system", "user", "assistant", "tool")


class RecordFormat(str, Enum):
    """What `data prepare` reads."""

    TEXT = "text"
    CHAT = "chat"
    PROMPT_COMPLETION = "prompt-completion"


class Skip(str, Enum):
    """Why a record was left out."""

    EMPTY_ANSWER = "empty answer"
    """Nothing the loss would count: an empty completion, or no assistant message with content."""
    UNMASKABLE = "answers the template cannot mark"
    """The chat template renders earlier turns differently once later ones follow, and marks no answers itself."""


@dataclass(frozen=True)
class Encoded:
    """One record's token ids and which of them the loss counts (1)."""

    ids: list[int]
    mask: list[int]


def _line_numbers(path: Path) -> Iterator[int]:
    """The numbers of a JSON Lines file's non-blank lines: `datasets` skips the blank ones."""
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number


def read_records(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(record, where it is, for messages) of each record of one file, in order."""
    builder = BUILDERS.get(path.suffix)
    if builder is None:
        raise UserError(
            f"INPUT: got {str(path)!r}, which is not a record file (.jsonl, .json or .parquet); give records, or "
            "use --format text for plain text"
        )
    import datasets

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    lines = _line_numbers(path) if path.suffix == ".jsonl" else None
    unit = "row" if builder == "parquet" else "record"
    with tempfile.TemporaryDirectory(prefix="zerotrain-records-") as cache:
        try:
            records = datasets.load_dataset(
                builder, data_files=str(path), split="train", streaming=True, cache_dir=cache
            )
            for k, record in enumerate(records):
                where = f"{path}:{next(lines)}" if lines is not None else f"{path} {unit} {k}"
                yield dict(record), where
        except (ValueError, TypeError, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"INPUT: {path} cannot be read as {builder} records ({first}); fix the file") from None


def _text(record: dict[str, Any], key: str, where: str, fmt: RecordFormat) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        found = "is missing" if value is None else f"is {type(value).__name__}, not a string"
        fields = "'prompt' and 'completion'" if fmt is RecordFormat.PROMPT_COMPLETION else "'messages'"
        raise UserError(
            f"INPUT: {where}: field {key!r} {found} (--format {fmt.value} reads {fields}); fix the record, or give "
            "the --format its records have"
        )
    return value


class PromptCompletion:
    """`prompt` and `completion` records through a `tokenizers` tokenizer."""

    def __init__(self, tokenizer: Any, eos_id: int | None) -> None:
        self.tokenizer, self.eos_id = tokenizer, eos_id

    def encode(self, record: dict[str, Any], where: str) -> Encoded | Skip:
        prompt = _text(record, "prompt", where, RecordFormat.PROMPT_COMPLETION)
        completion = _text(record, "completion", where, RecordFormat.PROMPT_COMPLETION)
        if not completion:
            return Skip.EMPTY_ANSWER
        asked = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        answer = self.tokenizer.encode(completion, add_special_tokens=False).ids
        answer += [self.eos_id] if self.eos_id is not None else []
        return Encoded(asked + answer, [0] * len(asked) + [1] * len(answer))


class Chat:
    """`messages` records through the tokenizer's chat template (transformers)."""

    def __init__(self, tokenizer_path: Path) -> None:
        directory = tokenizer_path if tokenizer_path.is_dir() else tokenizer_path.parent
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError(
                "--format chat: needs transformers for the chat template; pip install zerotrain[hf]"
            ) from None
        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as e:
            reason = " ".join(str(e).split())[:200]
            raise UserError(
                f"--tokenizer: cannot load {str(directory)!r} with transformers ({reason}); give the "
                "directory of a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)"
            ) from None
        template = self.tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise UserError(
                f"--tokenizer: {directory} has no chat template, which --format chat renders the messages with; add "
                "one (chat_template in tokenizer_config.json, or chat_template.jinja), or use --format "
                "prompt-completion"
            )
        self.template = template
        self.tagged = "{% generation %}" in template or "{%- generation %}" in template

    def _render(self, messages: list[dict[str, str]], **kw: Any) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, tokenize=True, **kw)["input_ids"])

    def _messages(self, record: dict[str, Any], where: str) -> list[dict[str, str]]:
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            found = "is missing" if messages is None else "is not a non-empty list"
            raise UserError(
                f"INPUT: {where}: field 'messages' {found} (--format chat reads a list of {{role, content}}); fix "
                "the record, or give the --format its records have"
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise UserError(f"INPUT: {where}: messages[{i}] is not {{role: str, content: str}}; fix the record")
            if m["role"] not in KNOWN_ROLES and m["role"] not in self.template:
                raise UserError(
                    f"INPUT: {where}: messages[{i}].role got {m['role']!r}, which the tokenizer's chat template does "
                    f"not know; use one of {', '.join(KNOWN_ROLES)}"
                )
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    def encode(self, record: dict[str, Any], where: str) -> Encoded | Skip:
        messages = self._messages(record, where)
        if not any(m["role"] == "assistant" and m["content"] for m in messages):
            return Skip.EMPTY_ANSWER
        try:
            if self.tagged:
                out = self.tokenizer.apply_chat_template(
                    messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
                )
                ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
            else:
                ids, mask = self._by_prefixes(messages)
        except Exception as e:  # jinja's TemplateError and whatever the template raises itself
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"INPUT: {where}: the tokenizer's chat template refuses these messages ({first}); fix the record"
            ) from None
        if not any(mask):
            return Skip.UNMASKABLE if ids else Skip.EMPTY_ANSWER
        return Encoded(ids, mask)

    def _by_prefixes(self, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
        """The assistant turns' tokens found by rendering up to each with and without it; no mask (all zero) when an
        earlier rendering is not a prefix of the whole."""
        ids = self._render(messages)
        mask = [0] * len(ids)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self._render(messages[:i], add_generation_prompt=True) if i else []
            upto = self._render(messages[: i + 1])
            if ids[: len(before)] != before or ids[: len(upto)] != upto:
                return ids, [0] * len(ids)
            mask[len(before) : len(upto)] = [1] * (len(upto) - len(before))
        return ids, mask


def template_digest(chat: Chat | None) -> str | None:
    return digest_of(chat.template.encode()) if chat is not None else None


def stats(lengths: list[int]) -> dict[str, int]:
    """The longest record and the 99th percentile: what seq_len should cover."""
    if not lengths:
        return {"longest": 0, "p99": 0}
    ordered = sorted(lengths)
    return {"longest": ordered[-1], "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


@dataclass
class RecordSplit:
    """One split's three files, written record by record: tokens, mask, and the offsets where records end."""

    tokens: IO[bytes]
    mask: IO[bytes]
    index: IO[bytes]
    dtype: str
    written: int = 0
    """Tokens so far: the offset the next record starts at."""
    records: int = 0
    lengths: list[int] = field(default_factory=list)

    def add(self, encoded: Encoded) -> None:
        import numpy as np

        if self.records == 0:
            self.index.write(np.asarray([0], dtype="<i8").tobytes())
        self.tokens.write(np.asarray(encoded.ids, dtype=NUMPY_DTYPES[self.dtype]).tobytes())
        self.mask.write(np.asarray(encoded.mask, dtype="u1").tobytes())
        self.written += len(encoded.ids)
        self.index.write(np.asarray([self.written], dtype="<i8").tobytes())
        self.records += 1
        self.lengths.append(len(encoded.ids))


@dataclass
class RecordWriter:
    """Encodes records into the splits: record i held out when i mod stride == 1, as documents are."""

    encoder: PromptCompletion | Chat
    limit: int
    """Token ids must be below this (the dtype's range)."""
    stride: int | None
    splits: dict[str, RecordSplit] = field(default_factory=dict)
    seen: int = 0
    skipped: dict[Skip, int] = field(default_factory=lambda: dict.fromkeys(Skip, 0))

    def add(self, record: dict[str, Any], where: str) -> None:
        encoded = self.encoder.encode(record, where)
        self.seen += 1
        if isinstance(encoded, Skip):
            self.skipped[encoded] += 1
            return
        if encoded.ids and max(encoded.ids) >= self.limit:
            raise UserError(
                f"--dtype: {where} has token id {max(encoded.ids)}, beyond the dtype's range (< {self.limit:,}); use "
                "--dtype uint32"
            )
        kept = sum(s.records for s in self.splits.values())
        held_out = self.stride is not None and kept % self.stride == 1
        self.splits["val" if held_out else "train"].add(encoded)

    def check_skipped(self, limit: float) -> None:
        """Refuse when more than `limit` of the records were skipped, saying how many for which reason."""
        total = sum(self.skipped.values())
        if self.seen and total / self.seen > limit:
            why = ", ".join(f"{n:,} for {reason.value}" for reason, n in self.skipped.items() if n)
            raise UserError(
                f"--max-skipped: got {limit}, but {total:,} of {self.seen:,} records ({total / self.seen:.1%}) were "
                f"skipped ({why}); fix the records or the tokenizer's chat template, or allow more with --max-skipped"
            )
