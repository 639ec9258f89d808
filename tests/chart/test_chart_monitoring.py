"""The chart's monitoring and settings agree with the operator: the PodMonitor selects the pods the operator builds
and scrapes every rank's port; every ZEROTRAIN_* variable the chart sets is an operator setting."""

from __future__ import annotations

import re

from chart_util import Obj, one, render

from zerotrain.operator.children import builders, naming
from zerotrain.operator.settings import ENV_PREFIX, OperatorSettings
from zerotrain.spec import ZeroTrainingJobSpec

MONITORS = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}


def _matches(selector: Obj, labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        op, key, values = expr["operator"], expr["key"], expr.get("values", [])
        ok = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
        }[op]
        if not ok:
            return False
    return True


def _meta_label(label: str) -> str:
    """Prometheus' service-discovery name of a pod label."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _training_pod(nproc: int) -> Obj:
    spec = ZeroTrainingJobSpec.model_validate(
        {"image": "runtime:0.1.0", "entrypoint": "pkg.mod:fn", "replicas": 2, "nprocPerNode": nproc}
    )
    return builders.build_pod(builders.JobRef(name="llm", namespace="team-a", uid="u"), spec, replica=1, gang=0)


def test_pod_monitor_selects_training_pods_and_keeps_every_rank_port() -> None:
    objects = render(MONITORS)
    monitor = one(objects, "PodMonitor")
    pod = _training_pod(nproc=4)
    assert _matches(monitor["spec"]["selector"], pod["metadata"]["labels"])
    operator_pod = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not _matches(monitor["spec"]["selector"], operator_pod), "the PodMonitor must not scrape the operator"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert "port" not in endpoint, "a single named port would miss local ranks > 0"
    keep = next(r for r in endpoint["relabelings"] if r.get("action") == "keep")
    assert keep["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"]
    ports = [p["name"] for c in pod["spec"]["containers"] for p in c["ports"]]
    scraped = [p for p in ports if re.fullmatch(keep["regex"], p)]
    assert len(scraped) == 4 and len(ports) > len(scraped), ports
    sources = {r["sourceLabels"][0]: r["targetLabel"] for r in endpoint["relabelings"] if "targetLabel" in r}
    assert sources[_meta_label(naming.LABEL_JOB)] == "zerotrain_job"
    assert sources[_meta_label(naming.LABEL_REPLICA)] == "zerotrain_node_rank"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_pod_monitor_follows_the_watched_namespaces() -> None:
    values = {**MONITORS, "operator": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]}}
    monitor = one(render(values), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objects = render(MONITORS)
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service")
    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]


def test_every_env_setting_is_an_operator_setting() -> None:
    values = {"operator": {"gpuMemory": "80Gi", "scope": "namespaced", "watchNamespaces": ["a", "b"]}}
    container = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "from-the-downward-api") for e in container["env"]}
    known = {ENV_PREFIX + name.upper() for name in OperatorSettings.model_fields}
    assert set(env) <= known, f"the chart sets variables the operator ignores: {sorted(set(env) - known)}"
    settings = OperatorSettings.from_env(env)
    assert settings.namespaces == ["a", "b"] and settings.gpu_memory == "80Gi"
    assert (settings.health_port, settings.metrics_port) == (8080, 9090)
