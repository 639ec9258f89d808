"""The chart ships the generated dashboard as a ConfigMap for Grafana's sidecar and, when asked, the alerts as a
PrometheusRule that promtool accepts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from budget import budget
from chart_util import by_kind, one, render
from e2e.prometheus import binary

from zerotrain.monitoring.alerts import ALERTS, rule_groups
from zerotrain.monitoring.dashboard import UID, dashboard_json


def test_chart_ships_the_dashboard_configmap_for_the_grafana_sidecar() -> None:
    cm = one(render(), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["zerotrain-training.json"])
    assert board == json.loads(dashboard_json()) and board["uid"] == UID
    moved = one(
        render({"grafanaDashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "ML"}}}), "ConfigMap"
    )
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert by_kind(render({"grafanaDashboard": {"enabled": False}}), "ConfigMap") == []


def test_chart_prometheus_rule_is_off_by_default_and_passes_promtool(tmp_path: Path) -> None:
    assert by_kind(render(), "PrometheusRule") == []
    rule = one(render({"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == rule_groups()
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=budget(60)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout
