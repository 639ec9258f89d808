"""Preference pairs for `zerotrain data prepare --format preference`: a prompt, a chosen and a rejected answer.

Records are laid out as TRL's preference datasets are:

- plain text: `prompt`, `chosen` and `rejected` strings. Each answer is tokenized after the prompt as
  `prompt-completion` records are (no special tokens, the end-of-text id after the answer);
- conversational: `chosen` and `rejected` lists of `{role, content}` (the answer's messages), and `prompt` a list of
  the messages before them, ending at a user turn; or, without `prompt`, `chosen` and `rejected` whole
  conversations that share their first messages (TRL's implicit prompt: the shared messages are the prompt). Each is
  rendered with the tokenizer's chat template: the prompt with the generation prompt, then prompt and answer
  together; the tokens after the prompt's rendering are the answer's.

Each pair is two records, its chosen answer then its rejected one, written one after the other into the same split,
so a pair is never split across files or ranks: record 2k and 2k + 1 are pair k. Only the answers' tokens are
marked. A pair with an empty answer, the same answer twice, or an answer the template cannot mark is skipped,
counted and named by its line, as chat records are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerotrain.commands.records import Chat, Encoded, Pair, PromptCompletion, RecordFormat, Skip, format_hint
from zerotrain.errors import UserError


class Preference:
    """`prompt`/`chosen`/`rejected` records, plain or conversational (the chat template loaded at the first
    conversational record)."""

    def __init__(self, tokenizer: Any, eos_id: int | None, tokenizer_path: Path) -> None:
        self.plain = PromptCompletion(tokenizer, eos_id)
        self.tokenizer_path = tokenizer_path
        self.chat: Chat | None = None
        """The tokenizer's chat template, loaded at the first conversational record."""

    def encode(self, record: dict[str, Any], where: str) -> Pair | Skip:
        chosen, rejected = (record.get(k) for k in ("chosen", "rejected"))
        if chosen is None or rejected is None:
            missing = " and ".join(repr(k) for k in ("chosen", "rejected") if record.get(k) is None)
            raise UserError(
                f"INPUT: {where}: field {missing} is missing (--format preference reads 'chosen' and 'rejected', "
                f"with 'prompt'){format_hint(record, RecordFormat.PREFERENCE)}; fix the record, or give the --format "
                "its records have"
            )
        if isinstance(chosen, str) and isinstance(rejected, str):
            return self._plain(record, chosen, rejected, where)
        if isinstance(chosen, list) and isinstance(rejected, list):
            return self._conversation(record, chosen, rejected, where)
        raise UserError(
            f"INPUT: {where}: 'chosen' and 'rejected' must both be strings or both lists of {{role, content}} (got "
            f"{type(chosen).__name__} and {type(rejected).__name__}); fix the record"
        )

    def _plain(self, record: dict[str, Any], chosen: str, rejected: str, where: str) -> Pair | Skip:
        prompt = record.get("prompt", "")
        if not isinstance(prompt, str):
            raise UserError(f"INPUT: {where}: 'prompt' is {type(prompt).__name__}, where 'chosen' is a string; fix it")
        if not chosen or not rejected:
            return Skip.EMPTY_ANSWER
        if chosen == rejected:
            return Skip.IDENTICAL_ANSWERS
        one, other = (self.plain.encode({"prompt": prompt, "completion": a}, where) for a in (chosen, rejected))
        assert isinstance(one, Encoded) and isinstance(other, Encoded)  # neither answer is empty
        return Pair(one, other)

    def _conversation(self, record: dict[str, Any], chosen: list[Any], rejected: list[Any], where: str) -> Pair | Skip:
        if self.chat is None:
            self.chat = Chat(self.tokenizer_path)
        chat = self.chat
        given = record.get("prompt")
        if given is None:  # TRL's implicit prompt: the messages both conversations begin with
            shared = 0
            while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
                shared += 1
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        elif isinstance(given, list):
            prompt = given
        else:
            raise UserError(
                f"INPUT: {where}: 'prompt' is {type(given).__name__}, where 'chosen' is a list of messages; give the "
                "prompt as a list of {role, content} too"
            )
        asked = chat.messages(prompt, where, "prompt") if prompt else []
        answers = [chat.messages(a, where, k) if a else [] for a, k in ((chosen, "chosen"), (rejected, "rejected"))]
        if not all(any(m["content"] for m in a) for a in answers):
            return Skip.EMPTY_ANSWER
        if answers[0] == answers[1]:
            return Skip.IDENTICAL_ANSWERS
        encoded = [chat.after_prompt(asked, a, where) for a in answers]
        if encoded[0] is None or encoded[1] is None:
            return Skip.UNMASKABLE
        return Pair(encoded[0], encoded[1])
