"""`zerotrain data prepare --format preference`: TRL's prompt/chosen/rejected records (plain strings, message lists
with an explicit or an implicit prompt) become pairs of records kept together in one split, the answers alone
marked; empty and identical answers skipped and named; a file of another format named for what it looks like; the
training path refuses pairs it would train on both answers of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_records import TAGGED, WORDS, tokenizer, write_jsonl

from zerotrain.cli import main
from zerotrain.runtime.job.record_data import RecordFiles, is_records
from zerotrain.runtime.job.task import ConfigError

pytest.importorskip("datasets")


def prepare(inputs: list[Path], tok: Path, out: Path, *extra: str, fmt: str = "preference") -> int:
    args = ["data", "prepare", *map(str, inputs), "--format", fmt, "--tokenizer", str(tok), "--out", str(out)]
    return main([*args, *extra])


def sequences(out: Path) -> list[tuple[list[str], list[str]]]:
    """Each record's words, and the words its mask marks."""
    files = RecordFiles.__new__(RecordFiles)  # the training path refuses pairs; read the files as it would
    import numpy as np

    files.tokens = np.fromfile(out / "train.bin", dtype=np.uint16)
    files.mask = np.fromfile(out / "train.mask", dtype=np.uint8)
    files.offsets = np.fromfile(out / "train.idx", dtype="<i8")
    got = []
    for r in range(len(files.offsets) - 1):
        ids, mask = files.record(r, 100)
        got.append(([WORDS[i] for i in ids], [WORDS[i] for i, m in zip(ids, mask, strict=True) if m]))
    return got


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_plain_and_conversational_pairs_mark_each_answer_after_its_prompt(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    records = [
        {"prompt": "hi", "chosen": "hello there", "rejected": "bye"},
        {"prompt": [user("hi")], "chosen": [bot("hello")], "rejected": [bot("bye bye")]},
        # TRL's implicit prompt: whole conversations that begin alike.
        {"chosen": [user("hi there"), bot("hello")], "rejected": [user("hi there"), bot("bye")]},
    ]
    out = tmp_path / "out"
    assert prepare([write_jsonl(tmp_path / "pairs.jsonl", records)], tok, out, "--val-fraction", "0") == 0
    got = sequences(out)
    assert [marked for _, marked in got] == [
        ["hello", "there", "<eos>"],
        ["bye", "<eos>"],
        ["hello", "<|im_end|>"],
        ["bye", "bye", "<|im_end|>"],
        ["hello", "<|im_end|>"],
        ["bye", "<|im_end|>"],
    ]
    # Each answer follows its whole prompt, rendered as the template renders it.
    assert got[2][0][:5] == ["<|im_start|>", "user", "hi", "<|im_end|>", "<|im_start|>"]
    assert got[4][0][:6] == ["<|im_start|>", "user", "hi", "there", "<|im_end|>", "<|im_start|>"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "preference" and meta["pairs"] == {"train": 3, "val": 0}
    assert meta["records"] == {"train": 6, "val": 0} and len(meta["chat_template_digest"]) == 16


def test_a_pair_is_held_out_whole(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    records = [{"prompt": "hi", "chosen": "hello", "rejected": w} for w in ("bye", "there", "hi", "bye bye")]
    out = tmp_path / "out"
    assert prepare([write_jsonl(tmp_path / "pairs.jsonl", records)], tok, out, "--val-fraction", "0.5") == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["pairs"] == {"train": 2, "val": 2} and meta["records"] == {"train": 4, "val": 4}
    # Pairs 1 and 3 are held out (i mod 2 == 1), each with both its answers; 0 and 2 train.
    assert [marked for _, marked in sequences(out)] == [
        ["hello", "<eos>"],
        ["bye", "<eos>"],
        ["hello", "<eos>"],
        ["hi", "<eos>"],
    ]


def test_empty_and_identical_answers_are_skipped_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    good = {"prompt": "hi", "chosen": "hello", "rejected": "bye"}
    records = [good, {"prompt": "hi", "chosen": "hello", "rejected": "hello"}, {**good, "chosen": ""}, good]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    assert prepare([path], tok, tmp_path / "o1") == 2
    error = " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "o1").exists()
    assert f"2 of 4 records (50.0%) were skipped (1 for empty answer: {path}:3, 1 for the same chosen and" in error
    assert f"rejected answer: {path}:2)" in error
    assert prepare([path], tok, tmp_path / "out", "--max-skipped", "0.5", "--val-fraction", "0") == 0
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["pairs"]["train"] == 2


def test_a_file_of_another_format_is_named_for_what_it_looks_like(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "hi", "chosen": "hello", "rejected": "bye"}])
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [user("hi"), bot("hello")]}])
    assert prepare([pairs], tok, tmp_path / "o1", fmt="chat") == 2
    assert "it looks like --format preference" in capsys.readouterr().err
    assert prepare([chat], tok, tmp_path / "o2") == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"INPUT: {chat}:1: field 'chosen' and 'rejected' is missing" in error
    assert "it looks like --format chat" in error
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_training_refuses_pairs_it_would_train_both_answers_of(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    out = tmp_path / "out"
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "hi", "chosen": "hello", "rejected": "bye"}])
    assert prepare([path], tok, out, "--val-fraction", "0") == 0
    assert is_records(str(out / "train.bin"))  # never read as a token stream
    with pytest.raises(ConfigError, match="prepared with --format preference"):
        RecordFiles(str(out / "train.bin"), "entrypointArgs.train_data")
