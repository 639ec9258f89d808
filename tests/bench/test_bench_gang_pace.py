"""bench/bench_gang_pace.py end to end at a small size: both systems create every pod on their own emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def test_gang_pace_prints_both_systems_and_their_ratio() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZEROTRAIN_E2E_KUBECONFIG"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_gang_pace.py"), "--pods", "8", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=budget(180),
        env=env,
        check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["pods"] == 8 and report["server"] == "emulator"
    for key in ("operator_pods_per_s", "plain_client_pods_per_s"):
        assert float(report[key].split()[0]) > 0, report
    assert report["operator_over_plain"] > 0
