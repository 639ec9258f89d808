"""bench/operator/bench_operator_scale.py end to end at a small size: the operator's phases and both plain-client
phases run, each on its own emulator process, and the figures the docs quote are all printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def test_operator_scale_prints_the_operator_and_the_plain_client_figures() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZEROTRAIN_E2E_KUBECONFIG"}
    args = ["--jobs", "4", "--wide-replicas", "2", "--resync", "1", "--steady-passes", "1"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "operator" / "bench_operator_scale.py"), *args],
        capture_output=True,
        text=True,
        timeout=budget(240),
        env=env,
        check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    for key in ("all_pods_exist_s", "all_running_s", "plain_pods_exist_s", "plain_same_writes_pods_exist_s"):
        assert report[key] > 0, (key, report)
    assert report["all_pods_exist_s"] <= report["all_running_s"]
    assert report["wide_ranks"] == 16 and report["steady_passes"] >= 4
    # Steady jobs cost nothing; while they started, each job's pods were created once.
    assert report["requests_per_job_pass"] == 0 and report["writes_per_job_pass"] == 0
    assert report["busy_requests_per_job"]["POST pods"] == 2
    # The emulator's record counts the wide job's 2 pods too: (4 x 2 + 2) / 4.
    assert report["served_per_job"]["zerotrain-operator create pods"] == 2.5
    assert report["operator_over_plain_same_writes"] > 0
    assert 0 < report["plain_first_pass_p50_s"] <= report["plain_first_pass_p99_s"]
    assert report["busy_p99_over_plain_first_pass_p99"] > 0
