"""`zerotrain run` with spec.training.lrSchedule and spec.training.evaluation on real gloo ranks: every step's
learning rate survives a resume (at the same or another world size), evaluation changes no training number, and
the evaluation loss is the same at any world size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import budget

from zerotrain.lr_schedule import learning_rate
from zerotrain.spec import TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = {"warmupSteps": 2, "decay": "cosine", "minLrRatio": 0.1}


def job(tmp_path: Path, name: str, evaluation: bool) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    spec = doc["spec"]
    spec["entrypointArgs"] = {
        "seq_len": 32,
        "batch_size": 4,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "max_bytes": 100_000,
        "eval_bytes": 10_000,  # held out with or without evaluation: both runs train on the same text
    }
    spec.pop("model")  # its declared Ψ is the quickstart's
    spec["training"].update({"steps": 6, "logEvery": 1, "lrSchedule": SCHEDULE, "optimizer": {"lr": 0.01}})
    if evaluation:
        spec["training"]["evaluation"] = {"everySteps": 3, "batches": 4}
    spec["checkpoint"] = {"intervalSteps": 3, "keepLast": 3}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(tmp_path: Path, manifest: Path, name: str, nproc: int, checkpoints: Path | None) -> tuple[dict[str, Any], str]:
    summary = tmp_path / f"{name}.json"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(manifest), "--summary-file", str(summary)]
    argv += ["--no-metrics", "--nproc", str(nproc)]
    if checkpoints is not None:
        argv += ["--checkpoint-dir", str(checkpoints)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(summary.read_text()), proc.stdout + proc.stderr


def newest(root: Path) -> Path:
    return max(root.iterdir(), key=lambda p: int(p.name.split("-")[1]))


@pytest.mark.slow
def test_a_resumed_run_trains_every_step_at_the_uninterrupted_learning_rate(tmp_path: Path) -> None:
    manifest = job(tmp_path, "scheduled", evaluation=True)
    ckpt = tmp_path / "ckpt"
    straight, output = run(tmp_path, manifest, "straight", 2, ckpt)
    training = TrainingSpec.model_validate({"steps": 6, "lrSchedule": SCHEDULE, "optimizer": {"lr": 0.01}})
    assert straight["learning_rates"] == [learning_rate(training, t) for t in range(1, 7)]
    assert straight["learning_rates"][0] == 0.005 and straight["learning_rates"][-1] == pytest.approx(0.001)
    assert "evaluation after step 3: loss" in output and "evaluation after step 6: loss" in output
    assert [e["step"] for e in straight["evaluations"]] == [3, 6]

    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    shutil.rmtree(newest(ckpt))  # as if the gang had died after step 5: it resumes from step 3
    shutil.rmtree(newest(other))
    resumed, output = run(tmp_path, manifest, "resumed", 2, ckpt)
    assert "at step 3" in output
    # Same world size: steps 4-6 and the last evaluation bit for bit.
    assert resumed["learning_rates"] == straight["learning_rates"][3:]
    assert resumed["losses"] == straight["losses"][3:]
    assert resumed["evaluations"] == straight["evaluations"][1:]

    # One rank from the two ranks' checkpoint: the same rates exactly, the losses up to summation order.
    single, _ = run(tmp_path, manifest, "single", 1, other)
    assert single["learning_rates"] == straight["learning_rates"][3:]
    assert single["losses"] == pytest.approx(straight["losses"][3:], rel=1e-5)
    assert single["evaluations"][0]["loss"] == pytest.approx(straight["evaluations"][1]["loss"], rel=1e-5)


@pytest.mark.slow
def test_evaluation_changes_no_training_number(tmp_path: Path) -> None:
    with_eval, _ = run(tmp_path, job(tmp_path, "with", evaluation=True), "with", 2, None)
    without, output = run(tmp_path, job(tmp_path, "without", evaluation=False), "without", 2, None)
    assert with_eval["losses"] == without["losses"]
    assert with_eval["grad_norms"] == without["grad_norms"]
    assert without["evaluations"] == [] and "evaluation" not in output
    assert len(with_eval["evaluations"]) == 2 and all(e["loss"] > 0 for e in with_eval["evaluations"])
