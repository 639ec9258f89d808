"""bench/runtime/bench_checkpoint.py runs both modes on a tiny model and reports what each save held the loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from budget import budget

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime"


@pytest.mark.slow
def test_both_modes_save_and_the_figures_are_written(tmp_path: Path) -> None:
    out = tmp_path / "checkpoint.json"
    args = ["--d-model", "64", "--layers", "1", "--saves", "2", "--every", "1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_checkpoint.py"), *args], capture_output=True, text=True, timeout=budget(300)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    for mode in ("sync", "async"):
        assert len(doc[mode]["blocked"]) == 2 and all(b > 0 for b in doc[mode]["blocked"])
        # Committed no sooner than it stopped blocking; a synchronous save is committed when it returns.
        assert all(c >= b for b, c in zip(doc[mode]["blocked"], doc[mode]["committed"], strict=True))
    assert doc["sync"]["blocked"] == doc["sync"]["committed"]
    assert doc["blocked_ratio"] > 0 and "blocks" in proc.stdout
