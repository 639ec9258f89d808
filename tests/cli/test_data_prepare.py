"""`zerotrain data prepare`: files that agree with the tokenizer, a deterministic held-out split, and refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zerotrain.cli import main
from zerotrain.data_files import tokenizer_digest
from zerotrain.runtime.job.token_data import TokenBatches, TokenFiles

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = ["abc.py", "bisect.py", "keyword.py", "colorsys.py", "this.py"]
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE of 300 ids trained on a few kB of the standard library, with an end-of-text token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([(STDLIB / name).read_text() for name in SOURCES[:3]], trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def word_level(path: Path, vocab: dict[str, int]) -> Path:
    """A whitespace word-level tokenizer with exactly `vocab` (ids may be sparse)."""
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> list[str]:
    """Documents in input order: three .py files (sorted by the glob), then the lines of a .jsonl."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for name in SOURCES[:3]:
        (texts / name).write_text((STDLIB / name).read_text())
    lines = [f"document {i}: " + "spam and eggs " * (i % 5 + 1) for i in range(20)]
    with (tmp_path / "lines.jsonl").open("w") as f:
        for i, line in enumerate(lines):
            f.write(json.dumps({"id": i, "body": line}) + "\n")
        f.write("\n")  # a trailing blank line is no document
    return [(texts / name).read_text() for name in sorted(SOURCES[:3])] + lines


def prepare(tmp_path: Path, tokenizer: Path, *extra: str, out: str = "out") -> int:
    inputs = [str(tmp_path / "texts" / "*.py"), str(tmp_path / "lines.jsonl")]
    args = ["data", "prepare", *inputs, "--tokenizer", str(tokenizer), "--out", str(tmp_path / out)]
    return main([*args, "--text-field", "body", *extra])


def test_files_agree_with_the_tokenizers_own_encoding(
    tmp_path: Path, tokenizer_file: Path, corpus: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert prepare(tmp_path, tokenizer_file, "--val-fraction", "0.2") == 0
    summary = capsys.readouterr().out
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    encoded = [[*tokenizer.encode(doc, add_special_tokens=False).ids, eos] for doc in corpus]
    held_out = [i for i in range(len(corpus)) if i % 5 == 1]  # stride round(1 / 0.2) = 5
    assert held_out == [1, 6, 11, 16, 21]
    want_val = [t for i in held_out for t in encoded[i]]
    want_train = [t for i, ids in enumerate(encoded) if i not in held_out for t in ids]
    out = tmp_path / "out"
    assert np.fromfile(out / "train.bin", dtype="<u2").tolist() == want_train
    assert np.fromfile(out / "val.bin", dtype="<u2").tolist() == want_val
    meta = json.loads((out / "meta.json").read_text())
    assert meta == {
        "dtype": "uint16",
        "vocab_size": tokenizer.get_vocab_size(),
        "tokens": {"train": len(want_train), "val": len(want_val)},
        "documents": {"train": len(corpus) - 5, "val": 5},
        "tokenizer": str(tokenizer_file.resolve()),
        "tokenizer_digest": tokenizer_digest(tokenizer_file),
        "eos_id": eos,
        "format": "text",
    }
    assert f"{len(want_train):,} train / {len(want_val):,} val tokens" in summary and "4 files" in summary
    assert "uint16" in summary and " s" in summary and len(summary.strip().splitlines()) == 1
    # The runtime reads what was written: dtype from meta.json, tokens in order.
    files = TokenFiles(str(out / "train.bin"))
    assert files.dtype == "uint16" and files.read(0, 50).tolist() == want_train[:50]
    assert TokenBatches(files, seq_len=32, batch_size=2, rank=0, world_size=1, vocab_size=300).global_batch(0).shape
    assert not list(out.glob("*.partial"))


def test_held_out_split_is_deterministic_and_disjoint(
    tmp_path: Path, tokenizer_file: Path, corpus: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert prepare(tmp_path, tokenizer_file, "--no-eos", "--val-fraction", "0.1", out="a") == 0
    assert prepare(tmp_path, tokenizer_file, "--no-eos", "--val-fraction", "0.1", out="b") == 0
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["documents"] == {"train": 20, "val": 3} and meta["eos_id"] is None  # documents 1, 11, 21
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    val = np.fromfile(tmp_path / "a" / "val.bin", dtype="<u2").tolist()
    assert val == [t for i in (1, 11, 21) for t in tokenizer.encode(corpus[i], add_special_tokens=False).ids]
    train = np.fromfile(tmp_path / "a" / "train.bin", dtype="<u2").tolist()
    assert len(train) + len(val) == sum(len(tokenizer.encode(d, add_special_tokens=False).ids) for d in corpus)
    assert prepare(tmp_path, tokenizer_file, "--val-fraction", "0", out="none") == 0
    assert (tmp_path / "none" / "val.bin").stat().st_size == 0


def test_two_documents_hold_out_one(tmp_path: Path, tokenizer_file: Path) -> None:
    for name in ("one.txt", "two.txt"):
        (tmp_path / name).write_text(f"the {name} text")
    args = ["data", "prepare", str(tmp_path / "*.txt"), "--tokenizer", str(tokenizer_file), "--out", str(tmp_path)]
    assert main(args) == 0
    assert json.loads((tmp_path / "meta.json").read_text())["documents"] == {"train": 1, "val": 1}


def test_large_vocabularies_get_uint32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    tokenizer = word_level(tmp_path / "tokenizer.json", vocab)
    (tmp_path / "doc.txt").write_text("w1 w69999 w300 nope")
    base = ["data", "prepare", str(tmp_path / "doc.txt"), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "o")]
    base += ["--val-fraction", "0"]  # one document would otherwise give its last tokens to val.bin
    assert main(base) == 0
    assert np.fromfile(tmp_path / "o" / "train.bin", dtype="<u4").tolist() == [1, 69_999, 300, 0]
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["dtype"] == "uint32"
    assert TokenFiles(str(tmp_path / "o" / "train.bin")).read(0, 4).tolist() == [1, 69_999, 300, 0]
    capsys.readouterr()
    assert main([*base, "--dtype", "uint16"]) == 2
    error = capsys.readouterr().err
    assert "--dtype: got uint16" in error and "70,000 ids" in error and "use --dtype uint32" in error


def refused(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    capsys.readouterr()
    assert main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and len(error.strip().splitlines()) == 1, error
    return error.strip()


def test_refusals_name_the_argument_value_and_fix(
    tmp_path: Path, tokenizer_file: Path, corpus: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "out")]
    good = [str(tmp_path / "lines.jsonl"), "--tokenizer", str(tokenizer_file), *out, "--text-field", "body"]

    (tmp_path / "broken.json").write_text("{not json")
    error = refused(capsys, ["data", "prepare", *good, "--tokenizer", str(tmp_path / "broken.json")])
    assert f"--tokenizer: cannot load '{tmp_path / 'broken.json'}' (" in error and "tokenizer.json" in error
    error = refused(capsys, ["data", "prepare", *good, "--tokenizer", str(tmp_path / "absent.json")])
    assert "absent.json" in error and "No such file" in error

    error = refused(capsys, ["data", "prepare", str(tmp_path / "nope" / "*.txt"), *good[1:]])
    assert f"INPUT: got '{tmp_path / 'nope' / '*.txt'}', which matches no file (searched {tmp_path / 'nope'})" in error

    (tmp_path / "bad.jsonl").write_text('{"body": "fine"}\n{"body": oops}\n')
    error = refused(capsys, ["data", "prepare", str(tmp_path / "bad.jsonl"), *good[1:]])
    assert f"INPUT: {tmp_path / 'bad.jsonl'}:2 is not JSON" in error
    error = refused(capsys, ["data", "prepare", *good[:-1], "title"])
    assert f"--text-field: got 'title', but it is missing in {tmp_path / 'lines.jsonl'}:1" in error

    error = refused(capsys, ["data", "prepare", str(tmp_path / "texts"), *good[1:]])
    assert f"INPUT: got '{tmp_path / 'texts'}', which is a directory; give its files" in error
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    error = refused(capsys, ["data", "prepare", str(tmp_path / "latin1.txt"), *good[1:]])
    assert f"INPUT: {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 3" in error and "convert it" in error

    error = refused(capsys, ["data", "prepare", *good, "--val-fraction", "0.9"])
    assert "--val-fraction: got 0.9; use a fraction in [0, 0.5]" in error
    assert not (tmp_path / "out" / "train.bin").exists() and not list((tmp_path / "out").glob("*"))


def test_ids_beyond_the_dtype_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three entries (auto: uint16) but a sparse id past 65,535.
    tokenizer = word_level(tmp_path / "tokenizer.json", {"[UNK]": 0, "a": 1, "big": 70_000})
    (tmp_path / "doc.txt").write_text("a big a")
    args = ["data", "prepare", str(tmp_path / "doc.txt"), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "o")]
    args += ["--val-fraction", "0"]
    error = refused(capsys, args)
    assert f"--dtype: got uint16, but {tmp_path / 'doc.txt'} has token id 70000" in error and "uint32" in error
    assert not list((tmp_path / "o").glob("*"))  # no partial output left behind
    assert main([*args, "--dtype", "uint32"]) == 0
    assert np.fromfile(tmp_path / "o" / "train.bin", dtype="<u4").tolist() == [1, 70_000, 1]


def test_the_command_module_is_torch_free() -> None:
    code = (
        "import sys, zerotrain.cli, zerotrain.commands.data; "
        "bad = [m for m in ('torch', 'tokenizers', 'numpy') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_text_file_holds_out_its_last_tokens(tmp_path: Path, tokenizer_file: Path) -> None:
    doc = (STDLIB / "bisect.py").read_text()
    (tmp_path / "one.py").write_text(doc)
    args = [
        "data",
        "prepare",
        str(tmp_path / "one.py"),
        "--tokenizer",
        str(tokenizer_file),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main([*args, "--val-fraction", "0.1"]) == 0
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = [*tokenizer.encode(doc, add_special_tokens=False).ids, tokenizer.token_to_id(EOS)]
    train = np.fromfile(tmp_path / "o" / "train.bin", dtype="<u2").tolist()
    val = np.fromfile(tmp_path / "o" / "val.bin", dtype="<u2").tolist()
    assert train + val == ids and len(val) == round(0.1 * len(ids))
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["tokens"] == {"train": len(train), "val": len(val)} and meta["documents"]["val"] == 1
