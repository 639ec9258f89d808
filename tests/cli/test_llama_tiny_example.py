"""examples/llama-tiny/README.md's commands, run as written but for the steps: data prepared from the standard
library, a Hugging Face Llama trained from its config with warm-up, cosine decay and evaluation, exported and
generated from with transformers."""

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


def readme_commands() -> list[str]:
    (block,) = re.findall(r"```sh\n(.*?)```", (EXAMPLE / "README.md").read_text(), flags=re.S)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


@pytest.mark.slow
def test_the_examples_three_commands_train_export_and_generate(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the commands' paths are the repository root's
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "PYTHONSAFEPATH": "1", "COLUMNS": "160"}
    commands = readme_commands()
    assert [c.split()[:2] for c in commands] == [
        ["zerotrain", "data"],
        ["zerotrain", "run"],
        ["zerotrain", "checkpoint"],
        ["python3", "examples/llama-tiny/generate.py"],
    ]
    outputs = []
    for command in commands:
        if command.startswith("zerotrain run"):
            command += " --steps 32 --no-metrics --summary-file summary.json"  # past the warm-up; one evaluation
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=budget(300)
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout + done.stderr)
    meta = json.loads((tmp_path / "runs" / "llama-tiny-data" / "meta.json").read_text())
    assert meta["vocab_size"] == 2048 and meta["dtype"] == "uint16" and meta["tokens"]["val"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["losses"]) == 32 and summary["losses"][0] == pytest.approx(7.62, abs=0.1)  # ln 2048
    assert summary["losses"][-1] < summary["losses"][0] - 1.0
    rates = summary["learning_rates"]
    assert rates[0] == pytest.approx(0.003 / 30) and max(rates) == pytest.approx(0.003) and rates[-1] < 0.003
    assert [e["step"] for e in summary["evaluations"]] == [32]
    exported = tmp_path / "runs" / "llama-tiny-hf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in exported.iterdir()}
    generated = outputs[-1].strip().splitlines()
    assert generated and len(generated[-1]) + len(generated) > 5  # the prompt and the tokens after it
