"""bench/operator/bench_in_place.py end to end, one trial of each strategy on the emulator: every part of the
recovery is measured and the ratio printed (the figures themselves live in docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from budget import budget

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("decided", "pods back", "start, rendezvous, build", "checkpoint load", "first step", "total")


def test_one_trial_of_each_strategy_names_every_part(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZEROTRAIN_E2E_KUBECONFIG"}
    out = tmp_path / "in_place.json"
    argv = [sys.executable, str(ROOT / "bench" / "operator" / "bench_in_place.py"), "--reps", "1", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(300), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = json.loads(out.read_text())
    assert sorted(trials) == ["InPlace", "Recreate"] and all(len(t) == 1 for t in trials.values()), trials
    for strategy, (got,) in trials.items():
        assert set(got) == set(PARTS), (strategy, got)
        assert all(got[p] >= 0 for p in PARTS) and got["total"] > 0, (strategy, got)
        # The parts partition the kill-to-first-step time.
        assert abs(sum(got[p] for p in PARTS[:-1]) - got["total"]) < 1e-6, (strategy, got)
    assert "InPlace / Recreate, kill to first step: " in proc.stdout
