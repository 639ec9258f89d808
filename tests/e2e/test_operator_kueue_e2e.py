"""Jobs admitted through Kueue's plain pod groups: the gang's pods carry the queue, group and size Kueue needs; pods
Kueue holds are reported as queued, not stuck; without Kueue or the queue no pod is created and status says why."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from zerotrain.operator.children import kueue
from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster
from .conftest import Operator
from .test_operator_e2e import JOBS, NO_NODE, call, condition, job_manifest, pods, wait_pods, wait_status

LOCALQUEUES = "kueue.x-k8s.io/v1beta1/localqueues"


def install_kueue(cluster: Cluster, queue: str) -> None:
    """What installing Kueue (its CRDs) and creating a LocalQueue do to the API server."""
    assert cluster.emulator is not None
    cluster.emulator.resources[LOCALQUEUES] = kmock.ResourceInfo(
        kind="LocalQueue", namespaced=True, verbs={"list", "watch", "get", "patch", "create", "delete"}
    )
    cluster.emulator.objects[LOCALQUEUES, cluster.namespace, queue] = {
        "apiVersion": kueue.API,
        "kind": "LocalQueue",
        "metadata": {"name": queue, "namespace": cluster.namespace},
        "spec": {"clusterQueue": "gpus"},
    }


def queued_job(name: str, ns: str, queue: str) -> dict[str, Any]:
    manifest = job_manifest(name, ns, scheduling={**NO_NODE, "startupTimeoutSeconds": 1})
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: queue}
    return manifest


async def test_a_queued_gang_is_one_kueue_pod_group_and_waits_as_queued(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    if cluster.emulator is None:
        pytest.skip("installs Kueue's API into the emulator")
    ns = cluster.namespace
    install_kueue(cluster, "team-q")
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), queued_job("queued", ns, "team-q"))
    created = await wait_pods(kube, ns, "queued", 2)
    for pod in created:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[kueue.QUEUE_LABEL] == "team-q" and labels[kueue.GROUP_LABEL] == "queued-gang-0"
        assert annotations[kueue.COUNT_ANNOTATION] == "2"
    # Kueue's webhook holds every pod of the group with its admission gate until the quota admits the group.
    gate = {"spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}]}}
    for pod in created:
        path = path_of("v1", "pods", ns, pod["metadata"]["name"])
        await call(kube.request, "PATCH", path, gate, "application/merge-patch+json")
    job = await wait_status(kube, ns, "queued", lambda s: condition({"status": s}, "Queued") is not None)
    assert condition(job, "Queued")["reason"] == "WaitingForAdmission"
    await asyncio.sleep(1.5)  # past startupTimeoutSeconds=1
    job = await call(kube.get_job, ns, "queued")
    unschedulable = condition(job, "Unschedulable")
    assert unschedulable is None or unschedulable["status"] == "False", "a queued gang is not a stuck gang"


async def test_no_pods_without_kueue_or_the_queue(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    if cluster.emulator is None:
        pytest.skip("needs an API server without Kueue, then installs it")
    ns = cluster.namespace
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), queued_job("unqueued", ns, "team-q"))
    job = await wait_status(kube, ns, "unqueued", lambda s: condition({"status": s}, "QueueUnavailable") is not None)
    cond = condition(job, "QueueUnavailable")
    assert cond["status"] == "True" and cond["reason"] == "KueueNotInstalled"
    assert "metadata.labels[kueue.x-k8s.io/queue-name]: got 'team-q', but Kueue is not installed" in cond["message"]
    assert not await call(pods, kube, ns, "unqueued")
    install_kueue(cluster, "other-q")  # Kueue arrives, but not this job's queue
    job = await wait_status(
        kube, ns, "unqueued", lambda s: condition({"status": s}, "QueueUnavailable")["reason"] == "LocalQueueNotFound"
    )
    assert "LocalQueue 'team-q' does not exist" in condition(job, "QueueUnavailable")["message"]
    install_kueue(cluster, "team-q")
    await wait_pods(kube, ns, "unqueued", 2)
    job = await wait_status(
        kube, ns, "unqueued", lambda s: condition({"status": s}, "QueueUnavailable")["status"] == "False"
    )


async def test_an_elastic_job_in_a_queue_is_refused_naming_both(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    """Kueue admits a fixed pod count, so an elastic gang there could not resize: refused before any pod. Runs
    unchanged on a real cluster: the refusal comes before the operator looks for the queue."""
    ns = cluster.namespace
    manifest = queued_job("elastic-q", ns, "team-q")
    manifest["spec"] |= {"elastic": {"minReplicas": 1, "maxReplicas": 2}, "checkpoint": {"claimName": "ckpt"}}
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), manifest)
    job = await wait_status(kube, ns, "elastic-q", lambda s: s.get("phase") == "Failed")
    invalid = condition(job, "InvalidSpec")
    assert invalid is not None and invalid["status"] == "True" and invalid["reason"] == "ElasticInQueue", invalid
    assert "spec.elastic: the job is in Kueue queue 'team-q'" in invalid["message"]
    assert await call(pods, kube, ns, "elastic-q") == []
