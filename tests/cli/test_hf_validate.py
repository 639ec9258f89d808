"""`zerotrain validate` on a job of the built-in Hugging Face entry point: the config, the model class, the token
files and the evaluation batches checked as a rank would check them, before any rank starts."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-tiny"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("tokens")
    sources = [str(p) for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]]
    argv = ["data", "prepare", *sources, "--tokenizer", str(EXAMPLE / "tokenizer.json"), "--out", str(out)]
    assert main([*argv, "--val-fraction", "0.5"]) == 0
    return out


def manifest(tmp_path: Path, data: Path, **args: Any) -> str:
    doc = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    doc["spec"]["entrypointArgs"].update(
        {"config": str(EXAMPLE), "train": str(data / "train.bin"), "eval": str(data / "val.bin"), **args}
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def said(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    return " ".join((out.out + out.err).split())


def test_a_good_job_is_checked_down_to_its_token_files(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", manifest(tmp_path, data)]) == 0
    text = said(capsys)
    assert "model: LlamaForCausalLM from spec.entrypointArgs.config;" in text
    assert "training tokens" in text and "evaluation micro-batches (seq_len 128)" in text
    assert "memory plan:" in text and "at its peak" in text  # planned from config.json, nothing typed


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"config": str(ROOT / "examples")}, ["spec.entrypointArgs.config", "has no config.json"]),
        ({"model_class": "LlamaForCausalLMM"}, ["LlamaForCausalLMM", "LlamaForCausalLM"]),
        ({"eval": "nothing-here/*.bin"}, ["spec.entrypointArgs.eval", "nothing-here/*.bin"]),
        ({"seq_len": 512}, ["seq_len", "512", "256"]),
    ],
)
def test_what_a_rank_would_refuse_validate_refuses_first(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], needles: list[str]
) -> None:
    assert main(["validate", manifest(tmp_path, data, **change)]) == 2
    text = said(capsys)
    for needle in needles:
        assert needle in text, text


def test_a_cut_token_file_and_too_few_evaluation_batches_are_refused(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.bin"
    cut.write_bytes((data / "train.bin").read_bytes()[:-1])  # an odd number of bytes of uint16 ids
    assert main(["validate", manifest(tmp_path, data, train=str(cut), token_dtype="uint16")]) == 2
    assert "cut.bin" in said(capsys)
    assert main(["validate", manifest(tmp_path, data, batch_size=64)]) == 2  # 4 micro-batches of 64 rows
    assert "spec.training.evaluation.batches: got 8" in said(capsys)
