"""`zerotrain data prepare --format chat|prompt-completion`: records from JSON Lines, JSON and Parquet through
`datasets`, rendered with the tokenizer's own chat template, the answers masked in; what is skipped, counted and
refused; nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from zerotrain.cli import main
from zerotrain.runtime.job.record_data import RecordFiles

pytest.importorskip("datasets")

WORDS = ["<eos>", "<|im_start|>", "<|im_end|>", "[UNK]", "user", "assistant", "system", "hi", "hello", "there", "bye"]
# ChatML, its assistant turns marked for transformers' assistant mask.
TAGGED = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} "
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} <|im_end|> {% endgeneration %}"
    "{% else %}{{ m['content'] }} <|im_end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
PLAIN = TAGGED.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def tokenizer(directory: Path, template: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.save(str(directory / "tokenizer.json"))
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"}
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


def conversations() -> list[dict[str, object]]:
    return [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
        {
            "messages": [
                {"role": "system", "content": "hi"},
                {"role": "user", "content": "hi there"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "bye bye"},
            ]
        },
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},  # nothing to learn
    ]


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def prepare(inputs: list[Path], tok: Path, out: Path, *extra: str) -> int:
    args = ["data", "prepare", *map(str, inputs), "--format", "chat", "--tokenizer", str(tok), "--out", str(out)]
    return main([*args, "--val-fraction", "0", *extra])


def counted_words(out: Path) -> list[list[str]]:
    files = RecordFiles(str(out / "train.bin"), "train")
    return [[WORDS[i] for i, m in zip(*files.record(r, 100), strict=True) if m] for r in range(len(files))]


@pytest.mark.parametrize("template", [TAGGED, PLAIN], ids=["generation-tags", "rendered-prefixes"])
def test_the_assistants_turns_and_their_ends_count_nothing_else(tmp_path: Path, template: str) -> None:
    tok = tokenizer(tmp_path / "tok", template)
    records = write_jsonl(tmp_path / "chat.jsonl", conversations())
    assert prepare([records], tok, tmp_path / "out", "--max-skipped", "0.5") == 0
    assert counted_words(tmp_path / "out") == [
        ["hello", "there", "<|im_end|>"],
        ["hello", "<|im_end|>", "bye", "bye", "<|im_end|>"],
    ]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["records"] == {"train": 2, "val": 0} and meta["skipped"]["empty_answer"] == 1
    assert len(meta["chat_template_digest"]) == 16 and len(meta["tokenizer_digest"]) == 16


def test_json_and_parquet_records_read_as_json_lines_do(tmp_path: Path) -> None:
    import pandas as pd

    tok = tokenizer(tmp_path / "tok", TAGGED)
    two = conversations()[:2]
    (tmp_path / "chat.json").write_text(json.dumps(two))
    pd.DataFrame({"messages": [r["messages"] for r in two]}).to_parquet(tmp_path / "chat.parquet")
    for name in ("chat.json", "chat.parquet"):
        assert prepare([tmp_path / name], tok, tmp_path / name.replace(".", "-")) == 0
        assert counted_words(tmp_path / name.replace(".", "-")) == counted_words_of_jsonl(tmp_path, tok, two)


def counted_words_of_jsonl(tmp_path: Path, tok: Path, records: list[dict[str, object]]) -> list[list[str]]:
    out = tmp_path / "from-jsonl"
    if not out.exists():
        assert prepare([write_jsonl(tmp_path / "two.jsonl", records)], tok, out) == 0
    return counted_words(out)


def refusal(capsys: pytest.CaptureFixture[str], inputs: list[Path], tok: Path, out: Path, *extra: str) -> str:
    assert prepare(inputs, tok, out, *extra) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert not [p for p in out.glob("*") if not p.name.startswith(".")]  # nothing that looks complete
    assert not list(out.glob(".prepare-*"))  # and nothing half-written left behind
    return error


def test_bad_records_are_refused_naming_the_record_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    good = conversations()[0]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"text": "hi"}) + "\n")
    error = refusal(capsys, [path], tok, tmp_path / "o1")
    assert f"INPUT: {path}:3: field 'messages' is missing (--format chat reads a list of {{role, content}})" in error

    role = {"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    error = refusal(capsys, [write_jsonl(tmp_path / "role.jsonl", [good, role])], tok, tmp_path / "o2")
    assert "role.jsonl:2: messages[0].role got 'wizard', which the tokenizer's chat template does not know" in error

    bare = tokenizer(tmp_path / "bare", None)
    error = refusal(capsys, [write_jsonl(tmp_path / "c.jsonl", [good])], bare, tmp_path / "o3")
    assert "--tokenizer: " in error and "has no chat template" in error and "--format prompt-completion" in error

    empty = write_jsonl(tmp_path / "e.jsonl", conversations())
    error = refusal(capsys, [empty], tok, tmp_path / "o4")
    assert f"--max-skipped: got 0.01, but 1 of 3 records (33.3%) were skipped (1 for empty answer: {empty}:3)" in error


def test_a_prepare_run_again_replaces_the_files_whole(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    out = tmp_path / "out"
    assert prepare([write_jsonl(tmp_path / "a.jsonl", conversations()[:2])], tok, out) == 0
    text = tmp_path / "doc.txt"
    text.write_text("hi there " * 20)
    assert main(["data", "prepare", str(text), "--tokenizer", str(tok), "--out", str(out)]) == 0
    assert json.loads((out / "meta.json").read_text())["format"] == "text"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no stale mask or index
    assert np.fromfile(out / "train.bin", dtype="<u2").size + np.fromfile(out / "val.bin", dtype="<u2").size == 41


def test_a_malformed_record_is_named_by_its_line_and_nothing_else_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON Lines and JSON arrays are read here, so a broken record is named by its 1-based line in the file (not a
    row of a read chunk), in one line, with no output of a library before it; the failed run leaves no --out."""
    tok = tokenizer(tmp_path / "tok", TAGGED)
    good = json.dumps(conversations()[0])
    lines = tmp_path / "lines.jsonl"
    lines.write_text("\n".join([good] * 20 + ["", '{"messages": [}'] + [good] * 5) + "\n")  # line 22 is broken
    out = tmp_path / "never"
    assert prepare([lines], tok, out) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured
    assert f"INPUT: {lines}:22: not valid JSON (Expecting value at column 15); fix that line" in captured.err
    assert not out.exists()

    array = tmp_path / "array.json"
    array.write_text("[\n  " + good + ",\n  " + good + ",\n  [1, 2],\n  " + good + "\n]\n")
    error = refusal(capsys, [array], tok, tmp_path / "o1")
    assert f"INPUT: {array}:4: a JSON list, not an object; each element of the array is one record" in error
    nothing = write_jsonl(tmp_path / "null.jsonl", [conversations()[0]])
    nothing.write_text(nothing.read_text() + "null\n")
    error = refusal(capsys, [nothing], tok, tmp_path / "o3")
    assert f"INPUT: {nothing}:2: a JSON null, not an object; each line of a .jsonl file is one record" in error
    array.write_text("[\n  " + good + ",\n  " + good + "\n  " + good + "\n]\n")  # a comma missing on line 3
    error = refusal(capsys, [array], tok, tmp_path / "o2")
    assert f"INPUT: {array}:4: expected ',' or ']' between records" in error


def test_skipped_records_are_named_by_their_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = tokenizer(tmp_path / "tok", TAGGED)
    records = conversations()
    path = write_jsonl(tmp_path / "chat.jsonl", records[:2] + [records[2]] * 5 + records[:2])
    assert prepare([path], tok, tmp_path / "out", "--max-skipped", "0.6") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"skipped 5 (5 empty answer: {path}:3, {path}:4, {path}:5 and 2 more)" in said
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["skipped_at"] == {"empty_answer": [f"{path}:{n}" for n in (3, 4, 5)]}
