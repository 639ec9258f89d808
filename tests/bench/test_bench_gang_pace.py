"""bench/operator/bench_gang_pace.py end to end at a small size: both systems create every pod on their own emulator."""

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
        [sys.executable, str(ROOT / "bench" / "operator" / "bench_gang_pace.py"), "--pods", "8", "--reps", "1"],
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


def test_the_plain_client_creates_the_operators_very_pods_owned_like_them() -> None:
    sys.path.insert(0, str(ROOT / "bench" / "operator"))
    from bench_gang_pace import plain_bodies

    template = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pace-0-r0",
            "namespace": "op",
            "uid": "u-pod",
            "resourceVersion": "7",
            "labels": {"zerotrain.dev/job": "pace-0"},
            "annotations": {"zerotrain.dev/applied": "d1"},
            "ownerReferences": [{"kind": "ZeroTrainingJob", "name": "pace-0", "uid": "u-op", "controller": True}],
        },
        "spec": {"containers": [{"name": "rank"}]},
        "status": {"phase": "Pending"},
    }
    owner = {"metadata": {"name": "pace-0", "uid": "u-plain"}}
    owned = plain_bodies(template, "plain", 2, owner)
    assert [p["metadata"]["name"] for p in owned] == ["plain-0", "plain-1"]
    meta = owned[1]["metadata"]
    assert meta["labels"] == {"bench": "plain", "zerotrain.dev/job": "pace-0"}
    assert meta["annotations"] == {"zerotrain.dev/applied": "d1"}
    assert meta["ownerReferences"] == [
        {"kind": "ZeroTrainingJob", "name": "pace-0", "uid": "u-plain", "controller": True}
    ]
    assert "uid" not in meta and "resourceVersion" not in meta and "status" not in owned[1]
    assert owned[1]["spec"] == template["spec"]
    bare = plain_bodies(template, "plain", 1, None)[0]["metadata"]
    assert bare == {"name": "plain-0", "namespace": "plain", "labels": {"bench": "plain"}}
