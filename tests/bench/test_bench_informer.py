"""bench/operator/bench_informer.py at a small size: every informer path takes the same events to the work queue
(the bench checks each did), and the report names each with its ratio to the operator's reflector."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def test_informer_bench_reports_every_path_against_the_reflector() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "operator" / "bench_informer.py"), "--events", "64", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=budget(120),
        check=True,
    ).stdout
    rows = dict(re.findall(r"^\s+(\S+)\s+[\d.]+\s+\([\d.-]+\)\s+([\d.]+)x the reflector$", out, re.M))
    assert set(rows) == {"reflector", "client-informer", "client-informer+dict", "kopf"}, out
    assert float(rows["reflector"]) == 1.0
