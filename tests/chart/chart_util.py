"""Rendering the chart offline (helm-python-sdk: Helm's Go SDK in a shared library, no helm binary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "zerotrain-operator"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
RELEASE = "zt"
NAMESPACE = "zerotrain-system"

Obj = dict[str, Any]

# CRs of CRDs the cluster may not have (Prometheus Operator): no Kubernetes schema to validate them against.
OPTIONAL_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),  # its rules are checked by promtool instead
}


def load_values(path: Path) -> Obj:
    values = yaml.safe_load(path.read_text())
    assert isinstance(values, dict), f"{path} must be a mapping"
    return values


def render_templates(values: Obj | None = None, namespace: str = NAMESPACE, release: str = RELEASE) -> dict[str, str]:
    """Template path (e.g. `zerotrain-operator/templates/deployment.yaml`) -> rendered text."""
    with helm.Chart.load(CHART_DIR) as chart:
        return chart.render(values, name=release, namespace=namespace, is_install=True)


def iter_objects(rendered: dict[str, str]) -> Iterator[tuple[str, Obj]]:
    """(template path, object) for every non-empty YAML document of every manifest template."""
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def render(values: Obj | None = None, namespace: str = NAMESPACE, release: str = RELEASE) -> list[Obj]:
    return [obj for _, obj in iter_objects(render_templates(values, namespace, release))]


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str) -> Obj:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]
