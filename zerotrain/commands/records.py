"""Instruction records for `zerotrain data prepare --format chat|prompt-completion`: read, rendered, masked.

Records come from JSON Lines and JSON (an array of objects) files, read here so that each record is known by its
line (a malformed one is named by it, and nothing else is said), and Parquet files, read through the `datasets`
library a row at a time (nothing fetched, nothing cached beside the output). JSON Lines stream line by line; a JSON
array is one document, read whole. Each record becomes token ids and a mask of the tokens the loss counts:

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
ones a template cannot mask, and the first few of each are named by their lines; `prepare` refuses a file set where
more than `--max-skipped` of the records were.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any, Protocol

from zerotrain.data_files import NUMPY_DTYPES, digest_of
from zerotrain.errors import UserError

RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
KNOWN_ROLES = ("system", "user", "assistant", "tool")
NAMED_SKIPS = 3
"""How many skipped records of each reason are named by their place (the summary, meta.json, refusals)."""


class RecordFormat(str, Enum):
    """What `data prepare` reads."""

    TEXT = "text"
    CHAT = "chat"
    PROMPT_COMPLETION = "prompt-completion"
    PREFERENCE = "preference"
    """Pairs of a chosen and a rejected answer to one prompt (`preference_records`)."""


class Skip(str, Enum):
    """Why a record was left out."""

    EMPTY_ANSWER = "empty answer"
    """Nothing the loss would count: an empty completion, or no assistant message with content."""
    UNMASKABLE = "answers the template cannot mark"
    """The chat template renders earlier turns differently once later ones follow, and marks no answers itself."""
    IDENTICAL_ANSWERS = "the same chosen and rejected answer"
    """A preference pair that prefers nothing."""


@dataclass(frozen=True)
class Encoded:
    """One record's token ids and which of them the loss counts (1)."""

    ids: list[int]
    mask: list[int]


@dataclass(frozen=True)
class Pair:
    """A preference record's two answers, each after the prompt (`preference_records`)."""

    chosen: Encoded
    rejected: Encoded


def looks_like(record: dict[str, Any]) -> RecordFormat | None:
    """The format a record's fields say it has, if any."""
    if "chosen" in record and "rejected" in record:
        return RecordFormat.PREFERENCE
    if "messages" in record:
        return RecordFormat.CHAT
    if "prompt" in record and "completion" in record:
        return RecordFormat.PROMPT_COMPLETION
    return None


def format_hint(record: dict[str, Any], fmt: RecordFormat) -> str:
    """'; it looks like --format X' where a record read as `fmt` has another format's fields, else ''."""
    other = looks_like(record)
    return "" if other is None or other is fmt else f"; it looks like --format {other.value}"


JSON_KINDS = {str: "string", type(None): "null", bool: "boolean"}
"""JSON's names for what Python calls otherwise (a list, an int, a float keep theirs)."""


def _an_object(value: object, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        kind = JSON_KINDS.get(type(value), type(value).__name__)
        raise UserError(
            f"INPUT: {where}: a JSON {kind}, not an object; {what} is one record, an object such as "
            '{"messages": [...]}; fix it'
        )
    return value


def json_lines(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Each record of a JSON Lines file and its `path:line` (1-based; blank lines are skipped)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(raw)
            except UnicodeDecodeError:
                raise UserError(f"INPUT: {where}: not UTF-8 text; fix that line (save the file as UTF-8)") from None
            except json.JSONDecodeError as e:
                raise UserError(
                    f"INPUT: {where}: not valid JSON ({e.msg} at column {e.colno}); fix that line (each line of a "
                    ".jsonl file is one JSON object)"
                ) from None
            yield _an_object(record, where, "each line of a .jsonl file"), where


def json_array(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Each record of a JSON file holding one array of records, and the `path:line` its object starts on."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"INPUT: {path}: not UTF-8 text; save it as UTF-8") from None
    decoder, at, line, counted = json.JSONDecoder(), 0, 1, 0

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def line_of(pos: int) -> int:
        nonlocal line, counted
        line, counted = line + text.count("\n", counted, pos), pos
        return line

    def broken(pos: int, why: str) -> UserError:
        return UserError(f"INPUT: {path}:{line_of(pos)}: {why}; fix the file (a .json file holds one array of records)")

    at = skip(at)
    if not text.startswith("[", at):
        raise broken(at, "not a JSON array")
    at = skip(at + 1)
    first = True
    while not text.startswith("]", at):
        if not first:
            if not text.startswith(",", at):
                raise broken(at, "expected ',' or ']' between records")
            at = skip(at + 1)
        try:
            record, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            raise broken(e.pos, f"not valid JSON ({e.msg} at column {e.colno})") from None
        where = f"{path}:{line_of(at)}"
        yield _an_object(record, where, "each element of the array"), where
        at, first = skip(end), False
    if skip(at + 1) != len(text):
        raise broken(skip(at + 1), "text after the array's end")


def parquet_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Each row of a Parquet file and `path row N` (0-based, as pandas and pyarrow count them)."""
    import datasets

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="zerotrain-records-") as cache:
        try:
            rows = datasets.load_dataset(
                "parquet", data_files=str(path), split="train", streaming=True, cache_dir=cache
            )
            for k, record in enumerate(rows):
                yield dict(record), f"{path} row {k}"
        except (ValueError, TypeError, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"INPUT: {path} cannot be read as Parquet ({first}); fix the file") from None


def read_records(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(record, where it is, for messages) of each record of one file, in order."""
    if path.suffix not in RECORD_SUFFIXES:
        raise UserError(
            f"INPUT: got {str(path)!r}, which is not a record file (.jsonl, .json or .parquet); give records, or "
            "use --format text for plain text"
        )
    readers = {".jsonl": json_lines, ".json": json_array, ".parquet": parquet_rows}
    yield from readers[path.suffix](path)


def _text(record: dict[str, Any], key: str, where: str, fmt: RecordFormat) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        found = "is missing" if value is None else f"is {type(value).__name__}, not a string"
        fields = "'prompt' and 'completion'" if fmt is RecordFormat.PROMPT_COMPLETION else "'messages'"
        raise UserError(
            f"INPUT: {where}: field {key!r} {found} (--format {fmt.value} reads {fields}){format_hint(record, fmt)}; "
            "fix the record, or give the --format its records have"
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
                f"INPUT: {where}: field 'messages' {found} (--format chat reads a list of {{role, content}})"
                f"{format_hint(record, RecordFormat.CHAT)}; fix the record, or give the --format its records have"
            )
        return self.messages(messages, where, "messages")

    def messages(self, messages: list[Any], where: str, name: str) -> list[dict[str, str]]:
        """Field `name`'s messages, checked: each {role, content}, a role the template knows."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise UserError(f"INPUT: {where}: {name}[{i}] is not {{role: str, content: str}}; fix the record")
            if m["role"] not in KNOWN_ROLES and m["role"] not in self.template:
                raise UserError(
                    f"INPUT: {where}: {name}[{i}].role got {m['role']!r}, which the tokenizer's chat template does "
                    f"not know; use one of {', '.join(KNOWN_ROLES)}"
                )
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    def after_prompt(self, prompt: list[dict[str, str]], answer: list[dict[str, str]], where: str) -> Encoded | None:
        """The prompt and the answer rendered together, the answer's tokens marked: those after the prompt's own
        rendering with the generation prompt (None when that rendering is not where the whole begins)."""
        try:
            before = self._render(prompt, add_generation_prompt=True) if prompt else []
            ids = self._render(prompt + answer)
        except Exception as e:  # jinja's TemplateError and whatever the template raises itself
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"INPUT: {where}: the tokenizer's chat template refuses these messages ({first}); fix the record"
            ) from None
        if ids[: len(before)] != before or len(ids) == len(before):
            return None
        return Encoded(ids, [0] * len(before) + [1] * (len(ids) - len(before)))

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


def named(places: list[str], count: int) -> str:
    """The first places of `count` skipped records: 'a.jsonl:3, a.jsonl:9 and 4 more'."""
    more = count - len(places)
    return ", ".join(places) + (f" and {more:,} more" if more > 0 else "")


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


class Encoder(Protocol):
    """What encodes one record: a sequence, a preference pair, or why it is skipped."""

    def encode(self, record: dict[str, Any], where: str) -> Encoded | Pair | Skip: ...


@dataclass
class RecordWriter:
    """Encodes records into the splits: record i held out when i mod stride == 1, as documents are."""

    encoder: Encoder
    limit: int
    """Token ids must be below this (the dtype's range)."""
    stride: int | None
    splits: dict[str, RecordSplit] = field(default_factory=dict)
    seen: int = 0
    skipped: dict[Skip, int] = field(default_factory=lambda: dict.fromkeys(Skip, 0))
    skipped_at: dict[Skip, list[str]] = field(default_factory=lambda: {s: [] for s in Skip})
    """Where the first NAMED_SKIPS of each reason's records are."""

    kept: int = 0
    """Records (or pairs) written so far: which split the next goes to."""

    def add(self, record: dict[str, Any], where: str) -> None:
        encoded = self.encoder.encode(record, where)
        self.seen += 1
        if isinstance(encoded, Skip):
            self.skipped[encoded] += 1
            if len(self.skipped_at[encoded]) < NAMED_SKIPS:
                self.skipped_at[encoded].append(where)
            return
        sequences = [encoded.chosen, encoded.rejected] if isinstance(encoded, Pair) else [encoded]
        for one in sequences:
            if one.ids and max(one.ids) >= self.limit:
                raise UserError(
                    f"--dtype: {where} has token id {max(one.ids)}, beyond the dtype's range (< {self.limit:,}); use "
                    "--dtype uint32"
                )
        held_out = self.stride is not None and self.kept % self.stride == 1
        for one in sequences:  # a pair's two answers go to one split, one after the other
            self.splits["val" if held_out else "train"].add(one)
        self.kept += 1

    def check_skipped(self, limit: float) -> None:
        """Refuse when more than `limit` of the records were skipped, saying how many for which reason."""
        total = sum(self.skipped.values())
        if self.seen and total / self.seen > limit:
            why = ", ".join(
                f"{n:,} for {reason.value}: {named(self.skipped_at[reason], n)}"
                for reason, n in self.skipped.items()
                if n
            )
            raise UserError(
                f"--max-skipped: got {limit}, but {total:,} of {self.seen:,} records ({total / self.seen:.1%}) were "
                f"skipped ({why}); fix the records or the tokenizer's chat template, or allow more with --max-skipped"
            )
