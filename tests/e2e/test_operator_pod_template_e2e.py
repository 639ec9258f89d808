"""A pod template reaches the pods on the API server; one that sets an operator-owned field is refused in status,
with an Event, and no pod is created."""

from __future__ import annotations

import asyncio

from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster
from .conftest import Operator
from .test_operator_e2e import JOBS, call, condition, job_manifest, pods, start_job, wait_status

TEMPLATE = {
    "metadata": {"labels": {"team": "nlp"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trainer",
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
            }
        ],
    },
}


async def test_the_template_reaches_the_pods(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    created = await start_job(kube, cluster.namespace, "templated", podTemplate=TEMPLATE)
    for pod in created:
        assert pod["metadata"]["labels"]["team"] == "nlp"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        env = pod["spec"]["containers"][0]["env"]
        assert env[-1]["name"] == "HF_TOKEN" and any(e["name"] == "MASTER_ADDR" for e in env)


async def test_a_template_setting_an_owned_field_is_refused(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    bad = {"spec": {"containers": [{"name": "trainer", "image": "elsewhere:1"}]}}
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest("overreach", ns, podTemplate=bad))
    job = await wait_status(kube, ns, "overreach", lambda s: s.get("phase") == "Failed")
    cond = condition(job, "InvalidSpec")
    assert cond["status"] == "True" and cond["reason"] == "InvalidPodTemplate"
    assert "spec.podTemplate.spec.containers[trainer].image: set by the operator from spec.image" in cond["message"]
    await asyncio.sleep(0.6)  # a resync later: still no pod
    assert not await call(pods, kube, ns, "overreach")
    events = await call(kube.request, "GET", path_of("v1", "events", ns))
    assert [e["type"] for e in events["items"] if e["reason"] == "InvalidPodTemplate"] == ["Warning"]
