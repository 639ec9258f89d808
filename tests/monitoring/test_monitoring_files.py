"""The dashboard and alert rules the chart ships: generated from zerotrain.monitoring (a drift fails), rendered by
the chart, checked by promtool, and each alert fires on the series it is about and only on those."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import budget
from e2e.prometheus import binary

from zerotrain.monitoring.__main__ import DASHBOARD, RULES, rules_yaml
from zerotrain.monitoring.alerts import ALERTS
from zerotrain.monitoring.dashboard import dashboard_json
from zerotrain.monitoring.dashboard_read import panel_queries

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "zerotrain-operator"


def test_committed_files_are_what_the_code_generates() -> None:
    assert (CHART_DIR / DASHBOARD).read_text() == dashboard_json(), "run `make monitoring` and commit the result"
    assert (CHART_DIR / RULES).read_text() == rules_yaml(), "run `make monitoring` and commit the result"


def test_dashboard_has_the_promised_panels_and_variables() -> None:
    board = json.loads(dashboard_json())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "namespace", "job", "rank"]
    titles = {title for title, _ in panel_queries(board)}
    for needed in (
        "Memory by category, against the plan",
        "Ranks holding the most memory",
        "Memory across ranks: min, median, max",
        "Plan error by category",
        "Plan error: the ranks furthest from it",
        "Device memory headroom",
        "Bandwidth by op",
        "Step time per rank",
        "Tokens per second",
        "Loss",
        "Evaluation loss",
        "Learning rate",
        "Gradient norm",
        "Checkpoint save and load",
        "Gang restarts by cause (operator)",
        "Job phase (operator)",
        "Device framebuffer (DCGM) next to ZeRO's accounting",
    ):
        assert needed in titles, needed
    # A 1,024-rank job stays readable: no panel repeats per rank, and per-rank lines are top-k or one rank.
    assert not [p.get("title") for p in board["panels"] if p.get("repeat")]
    exprs = [e for _, e in panel_queries(board)]
    assert any("DCGM_FI_DEV_FB_USED" in e for e in exprs)
    assert all("$job" in e for e in exprs), "every query follows the job variable"


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def firing(alert: str, **labels: str) -> dict[str, Any]:
    severity = next(a.severity for a in ALERTS if a.name == alert)
    all_labels = {"alertname": alert, "alertstate": "firing", "severity": severity, **labels}
    return {"labels": "ALERTS{" + ", ".join(f'{k}="{v}"' for k, v in all_labels.items()) + "}", "value": 1}


J = {"namespace": "ml", "zerotrain_job": "llm"}


def rank(r: int, **extra: str) -> dict[str, str]:
    return {**J, "pod": f"llm-worker-{r}", "rank": str(r), **extra}


# (alert, input series, eval time, the alerts expected firing): a healthy neighbour in each shows what must not fire.
CASES: list[tuple[str, list[dict[str, str]], str, list[dict[str, Any]]]] = [
    (
        "ZeroTrainRankMemoryNearLimit",
        [
            series("zerotrain_device_memory_used_bytes", "95x10", **rank(0, device="cpu")),
            series("zerotrain_device_memory_limit_bytes", "100x10", **rank(0, device="cpu")),
            series("zerotrain_device_memory_used_bytes", "50x10", **rank(1, device="cpu")),
            series("zerotrain_device_memory_limit_bytes", "100x10", **rank(1, device="cpu")),
        ],
        "10m",
        [firing("ZeroTrainRankMemoryNearLimit", **rank(0, device="cpu"))],
    ),
    (
        "ZeroTrainRankHeartbeatStale",
        [
            series("zerotrain_heartbeat_timestamp_seconds", "0x30", **rank(0)),  # stuck since t=0
            series("zerotrain_heartbeat_timestamp_seconds", "0+60x30", **rank(1)),  # moving
            series("zerotrain_heartbeat_timestamp_seconds", "0x30", **rank(2)),  # finished: quiet, not hung
            series("zerotrain_phase", "0x30", **rank(0, phase="finished")),
            series("zerotrain_phase", "0x30", **rank(1, phase="finished")),
            series("zerotrain_phase", "1x30", **rank(2, phase="finished")),
        ],
        "20m",
        [firing("ZeroTrainRankHeartbeatStale", **rank(0))],
    ),
    (
        "ZeroTrainJobRestartingRepeatedly",
        [
            series("zerotrain_operator_job_restarts_total", "0 1 2 3 4 5 5 5", **J, cause="Failed"),
            series(
                "zerotrain_operator_job_restarts_total",
                "0 1 1 1 1 1 1 1",
                namespace="ml",
                zerotrain_job="ok",
                cause="Evicted",
            ),
        ],
        "7m",
        [firing("ZeroTrainJobRestartingRepeatedly", **J)],
    ),
    (
        "ZeroTrainStragglingRank",
        [
            *(series("zerotrain_straggler", "0x30", **rank(r), cause=c) for r in range(3) for c in ("compute",)),
            series("zerotrain_straggler", "0x30", **rank(0), cause="input"),
            series("zerotrain_straggler", "0x30", **rank(1), cause="input"),
            series("zerotrain_straggler", "0x5 1x25", **rank(2), cause="input"),  # named from the 5th minute
        ],
        "25m",
        [firing("ZeroTrainStragglingRank", **rank(2), cause="input")],
    ),
    (
        "ZeroTrainTargetDown",
        [
            series("up", "0x10", **J, instance="10.0.0.1:9400"),
            series("up", "1x10", **J, instance="10.0.0.2:9400"),
        ],
        "10m",
        [firing("ZeroTrainTargetDown", **J, instance="10.0.0.1:9400")],
    ),
]


def test_every_alert_has_a_firing_case() -> None:
    assert sorted(c[0] for c in CASES) == sorted(a.name for a in ALERTS)


@pytest.mark.parametrize(("alert", "inputs", "at", "expected"), CASES, ids=[c[0] for c in CASES])
def test_alert_fires_on_its_case_and_only_there(
    alert: str, inputs: list[dict[str, str]], at: str, expected: list[dict[str, Any]], tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(rules_yaml())
    unit = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {"expr": 'ALERTS{alertstate="firing"}', "eval_time": at, "exp_samples": expected},
                    # Not yet at the start: every alert waits for its `for` (or its evidence) to build up.
                    {"expr": 'ALERTS{alertstate="firing"}', "eval_time": "0m", "exp_samples": []},
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        [binary("promtool"), "test", "rules", "test.yaml"],
        capture_output=True,
        text=True,
        timeout=budget(60),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
