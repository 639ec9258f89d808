"""A straggler named with its cause on real gloo ranks: `zerotrain run` of the slowed example entry point
(runtime/examples/slowed.py) names rank 1 within 20 steps, with cause input when its batches come 1.5× late and
cause compute when its blocks run 1.5× long, and each rank's /metrics-free summary still trains every step. The
healthy runs of the suite name no one (test_run_command asserts it on the quickstart)."""

from __future__ import annotations

import json
import re
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
        # Hidden 128, not the quickstart's 64: the blocks the compute slowdown stretches are then most of a step's
        # compute. Six of these runs at once gave a compute-slowed rank's window ratios of 0.91-1.85 (each run named
        # it); at 64, 0.40-2.88, and one run never held two windows in a row.
        "d_model": 128,
        "n_layers": 2,
        "n_heads": 2,
        "max_bytes": 100_000,
    }
    spec.pop("model")  # its declared Ψ is the quickstart's
    spec["training"].update({"steps": 20, "logEvery": 10})
    # Windows of 4 steps, a rank named after two in a row: five windows within the 20 steps, so one window spoiled
    # by the warm-up or by a busy neighbour still leaves two in a row. Under a full test run's load (three of these
    # jobs at once, at hidden 64) a window's compute ratio measured 0.83-4.9, median 1.7; in CI with windows of 5
    # (four windows) a compute-slowed rank once went unnamed. The threshold, stated, leaves a 1.5x slowdown room
    # above that noise.
    spec["stragglers"] = {"windowSteps": 4, "threshold": 1.2}
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
    verdicts = re.findall(r"after step (\d+)(?:: rank (\d+) holds the gang back \((\w+)\)| every rank)", output)
    assert verdicts, output
    first = verdicts[0][0]
    # The first verdict, within the 20 steps, names rank 1 with the cause it was slowed by, and the healthy rank is
    # never named with that cause. Not asserted: later verdicts, and the healthy rank named for the *other* cause. On
    # a host this busy one window can clear the slowed rank (named at step 8, cleared at 20 in a fresh-clone run),
    # and the rank that waits was named for compute beside it (at 1.59x; its gloo waits run on a thread of its own,
    # and each wake-up lands in its next compute phase). Healthy runs naming no one are asserted on the quickstart
    # and the killed-rank e2e.
    assert int(first) in (8, 12, 16, 20) and (first, "1", cause) in verdicts, verdicts
    assert not [v for v in verdicts if v[1] == "0" and v[2] == cause], verdicts
    # The summary keeps who was named for what, from which step's window to which.
    named = summary["stragglers"]
    assert {"rank": 1, "cause": cause, "from_step": int(first)} in [
        {k: v for k, v in entry.items() if k != "to_step"}
        for entry in named  # type: ignore[union-attr]
    ], named
    assert all(int(e["to_step"]) >= int(e["from_step"]) for e in named), named  # type: ignore[index]


@pytest.mark.slow
def test_a_healthy_run_beside_a_cpu_burner_names_no_one(tmp_path: Path) -> None:
    # The quickstart as a user runs it (windows of 10 steps), its cores shared with a compile (here a process
    # spinning on one of the two): the ranks' windows wobble, and a rank must be slow two windows in a row to be
    # named, and level two in a row to be cleared.
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["training"].update({"steps": 40, "logEvery": 20})
    job = tmp_path / "quickstart.yaml"
    job.write_text(yaml.safe_dump(doc))
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        summary, output = run(tmp_path, job)
    finally:
        burner.kill()
        burner.wait()
    assert len(summary["losses"]) == 40  # type: ignore[arg-type]
    assert summary["stragglers"] == [] and "holds the gang back" not in output, output
