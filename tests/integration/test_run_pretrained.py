"""`zerotrain run` with spec.model.pretrained: the weights are read into the shards, a job's own checkpoint takes
precedence (and it says so), every own checkpoint refused means the weights after all; a bad path is refused before
any rank starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from budget import budget
from test_run_resume import ROOT, run, tiny_job


def with_pretrained(job: Path, weights: Path) -> Path:
    doc = yaml.safe_load(job.read_text())
    doc["spec"].setdefault("model", {})["pretrained"] = {"path": str(weights)}
    out = job.with_name("pretrained-" + job.name)
    out.write_text(yaml.safe_dump(doc))
    return out


def _said(output: str) -> str:
    return " ".join(output.split())


@pytest.mark.slow
def test_pretrained_weights_then_the_jobs_own_checkpoint_then_the_weights_again(tmp_path: Path) -> None:
    from zerotrain.cli import main

    trained, _ = run(tmp_path, tiny_job(tmp_path, 4), "trained", tmp_path / "first")
    weights = tmp_path / "weights.safetensors"
    assert main(["checkpoint", "export", str(tmp_path / "first"), "--out", str(weights)]) == 0
    job = with_pretrained(tiny_job(tmp_path, 2), weights)
    tuned, output = run(tmp_path, job, "tuned", tmp_path / "own")
    assert f"pretrained weights from {weights} (exact names)" in _said(output)
    assert "pretrained: rank 0 read" in output
    # It starts from the trained weights, not where a fresh model does (the first run's first step: the same model,
    # seed and data, from scratch; the values themselves: test_pretrained).
    assert tuned["losses"][0] < trained["losses"][0] - 0.3 and len(trained["losses"]) == 4

    again, output = run(tmp_path, with_pretrained(tiny_job(tmp_path, 3), weights), "again", tmp_path / "own")
    assert "resumed from the job's own checkpoint: spec.model.pretrained" in _said(output)
    assert len(again["losses"]) == 1

    for f in (tmp_path / "own").glob("step-*/rank-*.safetensors"):
        f.write_bytes(b"corrupt")
    last, output = run(tmp_path, with_pretrained(tiny_job(tmp_path, 2), weights), "last", tmp_path / "own")
    assert f"pretrained weights from {weights}" in _said(output) and len(last["losses"]) == 2
    assert last["losses"] == pytest.approx(tuned["losses"], rel=1e-6)  # the same start as the first tuned run


def test_a_missing_pretrained_path_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    job = with_pretrained(tiny_job(tmp_path, 2), tmp_path / "nowhere")
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--no-metrics"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(120), cwd=tmp_path)
    assert proc.returncode == 2
    said = _said(proc.stderr)
    assert f"spec.model.pretrained.path: got '{tmp_path / 'nowhere'}'; does not exist" in said
    assert "logs:" not in proc.stdout  # nothing started
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "validate", str(job)],
        capture_output=True,
        text=True,
        timeout=budget(120),
    )
    assert proc.returncode == 2 and "spec.model.pretrained.path" in proc.stderr
    assert ROOT.is_dir()
