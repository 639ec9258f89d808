"""A straggler named with its cause on real gloo ranks: `zerotrain run` of the slowed example entry point
(runtime/examples/slowed.py) names rank 1 within 20 steps, with cause input when its batches come 1.5× late and
cause compute when its blocks run 1.5× long, and each rank's /metrics-free summary still trains every step. The
healthy runs of the suite name no one (test_run_command asserts it on the quickstart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def slowed_job(tmp_path: Path, cause: str, factor: float) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    spec = doc["spec"]
    spec["entrypoint"] = "zerotrain.runtime.examples.slowed:build"
    spec["entrypointArgs"] = {
        "slow_rank": 1,
        "cause": cause,
        "factor": factor,
        "data_seconds": 0.06 if cause == "input" else 0.0,
        "seq_len": 64,
        "batch_size": 8,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 2,
        "max_bytes": 100_000,
    }
    spec.pop("model")  # its declared Ψ is the quickstart's
    spec["training"].update({"steps": 20, "logEvery": 10})
    # Windows of 5 steps, a rank named after two in a row: four windows within the 20 steps. The threshold, stated,
    # leaves a 1.5x slowdown room above the noise of a full test run (the compute slowdown sleeps after the blocks
    # alone, so the rank's whole compute is somewhat under 1.5x).
    spec["stragglers"] = {"windowSteps": 5, "threshold": 1.2}
    path = tmp_path / f"slowed-{cause}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(tmp_path: Path, job: Path) -> tuple[dict[str, object], str]:
    summary = tmp_path / f"{job.stem}.json"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--no-metrics", "--summary-file", str(summary)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(summary.read_text()), " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.slow
@pytest.mark.parametrize("cause", ["input", "compute"])
def test_a_rank_slowed_one_and_a_half_times_is_named_with_its_cause_within_twenty_steps(
    tmp_path: Path, cause: str
) -> None:
    summary, output = run(tmp_path, slowed_job(tmp_path, cause, 1.5))
    assert len(summary["losses"]) == 20  # type: ignore[arg-type]
    named = [ln for ln in output.split("straggler after step ")[1:]]
    assert named, output
    assert named[0].startswith(tuple(f"{n}: rank 1 holds the gang back" for n in (10, 15, 20))), named
    assert f"rank 1 holds the gang back ({cause})" in named[0], named
    assert "rank 0 holds the gang back" not in output, output
