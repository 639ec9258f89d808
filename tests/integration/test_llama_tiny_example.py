"""examples/llama-tiny/README.md's commands, run as written: data prepared from the standard library, a Hugging Face
Llama trained from its config with warm-up, cosine decay and evaluation, exported and generated from with
transformers; then examples/sft-lora/README.md's, on that export: LoRA at stage 3 on instruction records, the
adapters exported for peft, and held-out exact match from 0% to at least 90%."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from budget import budget

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-tiny"


def readme_commands(example: str) -> list[str]:
    (block,) = re.findall(r"```sh\n(.*?)```", (ROOT / "examples" / example / "README.md").read_text(), flags=re.S)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def run_commands(commands: list[str], cwd: Path) -> list[str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "PYTHONSAFEPATH": "1", "COLUMNS": "160"}
    outputs = []
    for command in commands:
        if command.startswith("zerotrain run"):
            command += " --no-metrics --summary-file summary.json"
        done = subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=budget(600)
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout + done.stderr)
    return outputs


@pytest.fixture(scope="module")
def llama_tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The llama-tiny example's commands, as written, in a fresh directory (its paths are the repository root's)."""
    pytest.importorskip("transformers")
    where = tmp_path_factory.mktemp("examples")
    (where / "examples").symlink_to(ROOT / "examples")
    commands = readme_commands("llama-tiny")
    assert [c.split()[:2] for c in commands] == [
        ["zerotrain", "data"],
        ["zerotrain", "run"],
        ["zerotrain", "checkpoint"],
        ["python3", "examples/llama-tiny/generate.py"],
    ]
    return where, run_commands(commands, where)


@pytest.mark.slow
@pytest.mark.timeout(900)  # its fixture's four commands count here: 1.5 min alone, over 300 s under the suite's load
def test_the_examples_three_commands_train_export_and_generate(llama_tiny: tuple[Path, list[str]]) -> None:
    where, outputs = llama_tiny
    meta = json.loads((where / "runs" / "llama-tiny-data" / "meta.json").read_text())
    assert meta["vocab_size"] == 2048 and meta["dtype"] == "uint16" and meta["tokens"]["val"] > 0
    summary = json.loads((where / "summary.json").read_text())
    assert len(summary["losses"]) == 300 and summary["losses"][0] == pytest.approx(7.62, abs=0.1)  # ln 2048
    assert summary["losses"][-1] < summary["losses"][0] - 3.0
    rates = summary["learning_rates"]
    assert rates[0] == pytest.approx(0.003 / 30) and max(rates) == pytest.approx(0.003) and rates[-1] < 0.003
    assert [e["step"] for e in summary["evaluations"]] == [100, 200, 300]
    exported = where / "runs" / "llama-tiny-hf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in exported.iterdir()}
    generated = outputs[-1].strip().splitlines()
    assert generated and len(generated[-1]) + len(generated) > 5  # the prompt and the tokens after it


@pytest.mark.slow
@pytest.mark.timeout(900)  # the sft-lora chain, and the llama-tiny fixture when this test runs first
def test_lora_on_the_export_learns_what_the_base_could_not(llama_tiny: tuple[Path, list[str]]) -> None:
    pytest.importorskip("peft")
    where, _ = llama_tiny
    commands = readme_commands("sft-lora")
    assert [c.split()[:2] for c in commands] == [
        ["python3", "examples/sft-lora/make_data.py"],
        ["zerotrain", "data"],
        ["python3", "examples/sft-lora/evaluate.py"],
        ["zerotrain", "run"],
        ["zerotrain", "checkpoint"],
        ["python3", "examples/sft-lora/evaluate.py"],
    ]
    outputs = run_commands(commands, where)
    before, after = (exact_match(outputs[i]) for i in (2, 5))
    assert before <= 0.1 and after >= 0.9, (before, after)  # the margin the README states
    assert "completions" in (ROOT / "examples" / "sft-lora" / "README.md").read_text()
    summary = json.loads((where / "summary.json").read_text())
    assert len(summary["losses"]) == 800 and summary["evaluations"][-1]["loss"] < summary["evaluations"][0]["loss"]
    config = json.loads((where / "runs" / "sft-lora-adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["model.norm"] and config["r"] == 8


def exact_match(output: str) -> float:
    (share,) = re.findall(r"exact match: ([0-9.]+)%", output)
    return float(share) / 100
