"""A running gang's config never changes under it: a spec edit applies from the next gang, which gets its own
immutable ConfigMap; the previous gang's goes."""

from __future__ import annotations

from typing import Any

import yaml

from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster, until_async
from .conftest import Operator
from .kubelet import set_pod_phase
from .test_operator_e2e import JOBS, call, start_job, wait_pods


def config(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", path_of("v1", "configmaps", ns, name))
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def env_in(cm: dict[str, Any]) -> dict[str, str]:
    spec = yaml.safe_load(cm["data"]["job.yaml"])["spec"]
    return {e["name"]: e["value"] for e in spec.get("env", [])}


async def test_spec_edit_waits_for_the_next_gang(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "steady", env=[{"name": "LR_SCHEDULE", "value": "cosine"}])
    first = await call(config, kube, ns, "steady-config-0")
    assert first is not None and first.get("immutable") is True and env_in(first) == {"LR_SCHEDULE": "cosine"}
    patch = {"spec": {"env": [{"name": "LR_SCHEDULE", "value": "linear"}]}}
    await call(kube.request, "PATCH", path_of(JOBS, PLURAL, ns, "steady"), patch, "application/merge-patch+json")
    await until_async(lambda: operator.metrics.reconciles.labels(result="ok")._value.get() > 0)
    after_edit = await call(config, kube, ns, "steady-config-0")
    assert after_edit is not None and after_edit["data"] == first["data"], "the running gang's config changed"
    assert await call(config, kube, ns, "steady-config-1") is None
    await call(set_pod_phase, kube, ns, "steady-worker-0", "Failed", 1)
    await wait_pods(kube, ns, "steady", 2, gang=1)
    second = await call(config, kube, ns, "steady-config-1")
    assert second is not None and env_in(second) == {"LR_SCHEDULE": "linear"}
    await until_async(lambda: config(kube, ns, "steady-config-0") is None)
