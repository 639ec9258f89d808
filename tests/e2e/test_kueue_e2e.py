"""zerotrain behind the real Kueue, on a real API server: a gang is one Workload admitted whole against a
ClusterQueue's CPU quota; a gang that does not fit stays gated, Queued with Kueue's own words, and starts only
when the first finishes; a higher-priority job preempts a running gang, which comes back from its newest
checkpoint with the restart counted as a preemption; a queued job deleted leaves no Workload and no pod; a job
naming a LocalQueue that does not exist gets no pods.

Needs a real API server (ZEROTRAIN_E2E_KUBECONFIG) with a real Kueue beside it (ZEROTRAIN_E2E_KUEUE, the health
endpoint `python tests/e2e/kueue_env.py up` prints; docs/operator.md). test_operator_kueue_e2e.py is the fast path
on the emulator, where the test plays Kueue."""

from __future__ import annotations

import asyncio
import os
import re
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from zerotrain.operator.children import kueue
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.spec import PLURAL

from .cluster import KUBECONFIG_ENV, Cluster, until_async
from .conftest import Operator
from .kueue_env import HEALTH_ENV
from .process_kubelet import ProcessKubelet
from .test_operator_e2e import JOBS, call, condition, job_manifest, pods, wait_status
from .test_training_e2e import START_S, TINY, resumed_step

KUEUE = "kueue.x-k8s.io/v1beta2"
CPU_PER_POD = "1"


def _kueue_answers() -> bool:
    url = os.environ.get(HEALTH_ENV)
    if not url:
        return False
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get(KUBECONFIG_ENV) or not _kueue_answers(),
        reason=f"needs a real API server ({KUBECONFIG_ENV}) and a real Kueue beside it ({HEALTH_ENV}, answering "
        "/readyz): `python tests/e2e/kueue_env.py up` (docs/operator.md)",
    ),
]


@dataclass(frozen=True)
class Quota:
    """A ResourceFlavor, a ClusterQueue with `cpu` of CPU, and LocalQueue `queue` in the test's namespace."""

    cluster_queue: str
    queue: str = "team"


async def _apply(kube: Kube, plural: str, body: dict[str, Any], namespace: str | None = None) -> None:
    await call(kube.request, "POST", path_of(KUEUE, plural, namespace), {"apiVersion": KUEUE, **body})


async def _delete(kube: Kube, plural: str, name: str, namespace: str | None = None) -> None:
    try:
        await call(kube.request, "DELETE", path_of(KUEUE, plural, namespace, name))
    except KubeError as e:
        if e.status != 404:
            raise


@pytest.fixture
async def quota(cluster: Cluster, kube: Kube) -> AsyncIterator[Quota]:
    """Room for one 2-pod gang of CPU_PER_POD each, preempting lower priorities within the queue."""
    ns, name = cluster.namespace, f"zt-{cluster.namespace}"
    await _apply(kube, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": name}})
    resources = [{"name": "cpu", "nominalQuota": "2"}]
    await _apply(
        kube,
        "clusterqueues",
        {
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": name, "resources": resources}]}],
                "preemption": {"withinClusterQueue": "LowerPriority"},
            },
        },
    )
    local = {"kind": "LocalQueue", "metadata": {"name": "team", "namespace": ns}, "spec": {"clusterQueue": name}}
    await _apply(kube, "localqueues", local, ns)
    yield Quota(name)
    await _delete(kube, "localqueues", "team", ns)
    await _delete(kube, "clusterqueues", name)
    await _delete(kube, "resourceflavors", name)


def queued(name: str, ns: str, queue: str, steps: int, priority: str | None = None, **spec: Any) -> dict[str, Any]:
    """TINY (the training e2e's GPT) in `queue`, each pod requesting CPU_PER_POD, paced so it lasts a while."""
    args = {**TINY["entrypointArgs"], "factor": 1.0, "data_seconds": 0.1}
    body = job_manifest(
        name,
        ns,
        **{
            **TINY,
            "entrypoint": "zerotrain.runtime.examples.slowed:build",
            "entrypointArgs": args,
            "training": {"steps": steps, "seed": 0, "logEvery": 10},
            "resources": {"cpu": CPU_PER_POD},
            **spec,
        },
    )
    labels = {kueue.QUEUE_LABEL: queue} | ({kueue.PRIORITY_LABEL: priority} if priority else {})
    body["metadata"]["labels"] = labels
    return body


def gated(pod: dict[str, Any]) -> bool:
    return kueue.is_gated(pod)


def workload(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", path_of(KUEUE, "workloads", ns, name))
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def admitted(wl: dict[str, Any] | None) -> bool:
    conditions = ((wl or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)


async def test_a_gang_that_fits_is_one_workload_admitted_whole_and_a_second_waits_for_it(
    cluster: Cluster, operator: Operator, kube: Kube, quota: Quota, tmp_path: Path
) -> None:
    ns = cluster.namespace
    async with (
        ProcessKubelet(cluster, "first", tmp_path / "first") as first_pods,
        ProcessKubelet(cluster, "second", tmp_path / "second") as second_pods,
    ):
        await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), queued("first", ns, quota.queue, 150))
        wl = await until_async(lambda: workload(kube, ns, "first-gang-0"), 30)
        (podset,) = wl["spec"]["podSets"]
        assert podset["count"] == 2, wl["spec"]  # one Workload for the gang, both pods in it
        await until_async(lambda: admitted(workload(kube, ns, "first-gang-0")), 30)
        await until_async(lambda: [p for p in pods(kube, ns, "first") if not gated(p)] == pods(kube, ns, "first"), 30)
        await wait_status(kube, ns, "first", lambda s: s.get("phase") == "Running", START_S)

        await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), queued("second", ns, quota.queue, 20))
        job = await wait_status(kube, ns, "second", lambda s: "Kueue: " in (_queued(s) or {}).get("message", ""), 60)
        held = _queued(job["status"])
        assert held["status"] == "True" and held["reason"] == "WaitingForAdmission", held
        assert re.search(r"quota for cpu", held["message"]), held  # Kueue's own words: what it waits for
        assert all(gated(p) for p in await call(pods, kube, ns, "second"))
        assert not second_pods.pods, "a pod of the gang Kueue holds was started"

        # Until the first job is seen finished, no pod of the second may have started.
        deadline = asyncio.get_running_loop().time() + START_S
        while (done := await call(kube.get_job, ns, "first"))["status"].get("phase") not in ("Succeeded", "Failed"):
            assert not second_pods.pods, "a pod of the held gang started while the first gang ran"
            assert asyncio.get_running_loop().time() < deadline, done["status"]
            await asyncio.sleep(0.2)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        job = await wait_status(kube, ns, "second", lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S * 2)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert _queued(job["status"])["status"] == "False", job["status"]
        assert first_pods.pods and all(p.exit_code == 0 for p in first_pods.pods + second_pods.pods)


def _queued(status: dict[str, Any]) -> dict[str, Any] | None:
    return condition({"status": status}, "Queued")


async def test_a_higher_priority_job_preempts_a_gang_which_comes_back_from_its_checkpoint(
    cluster: Cluster, operator: Operator, kube: Kube, quota: Quota, tmp_path: Path
) -> None:
    ns = cluster.namespace
    for name, value in (("zt-low", 100), ("zt-high", 1000)):
        body = {"kind": "WorkloadPriorityClass", "metadata": {"name": f"{name}-{ns}"}, "value": value}
        await _apply(kube, "workloadpriorityclasses", body)
    ckpt = {"checkpoint": {"claimName": "ckpt", "intervalSteps": 10, "keepLast": 2}}
    low = queued("low", ns, quota.queue, 300, f"zt-low-{ns}", **ckpt)
    high = queued("high", ns, quota.queue, 20, f"zt-high-{ns}")
    try:
        async with (
            ProcessKubelet(cluster, "low", tmp_path / "low", graceful=True) as low_pods,
            ProcessKubelet(cluster, "high", tmp_path / "high", graceful=True),
        ):
            await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), low)
            before = await wait_status(kube, ns, "low", lambda s: (s.get("lastCheckpoint") or {}).get("step"), START_S)
            await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), high)
            job = await wait_status(kube, ns, "low", lambda s: s.get("restarts", {}).get("total") == 1, 60)
            counts = {k: job["status"]["restarts"][k] for k in ("total", "failures", "byCause")}
            assert counts == {"total": 1, "failures": 0, "byCause": {"Preempted": 1}}, job
            done = await wait_status(kube, ns, "high", lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S)
            assert done["status"]["phase"] == "Succeeded", done["status"]
            job = await wait_status(kube, ns, "low", lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S * 3)
            assert job["status"]["phase"] == "Succeeded", job["status"]
            first, second = low_pods.gang(0), low_pods.gang(1)
            # No committed step lost: the new gang resumed from the newest checkpoint the preempted one committed
            # (SIGTERM made it commit the step it was on).
            newest = max(int(n) for p in first for n in re.findall(r'"checkpoint_step": (\d+)', p.output()))
            assert newest >= before["status"]["lastCheckpoint"]["step"]
            assert second and {resumed_step(p.output()) for p in second} == {newest}, "resumed from another step"
            assert job["status"]["step"] == 300 and job["status"]["restarts"]["failures"] == 0
    finally:
        for name in ("zt-low", "zt-high"):
            await _delete(kube, "workloadpriorityclasses", f"{name}-{ns}")


async def test_a_queued_job_deleted_leaves_no_workload_and_no_pod(
    cluster: Cluster, operator: Operator, kube: Kube, quota: Quota
) -> None:
    ns = cluster.namespace
    too_big = queued("big", ns, quota.queue, 20, resources={"cpu": "2"})  # 4 CPUs: never fits in 2
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), too_big)
    await wait_status(kube, ns, "big", lambda s: "Kueue: " in (_queued(s) or {}).get("message", ""), 60)
    assert await call(workload, kube, ns, "big-gang-0") is not None
    await call(kube.delete_job, ns, "big")
    try:
        await until_async(lambda: not pods(kube, ns, "big"), 60)
    except AssertionError:
        left = [
            (
                p["metadata"]["name"],
                p["metadata"].get("deletionTimestamp"),
                p["metadata"].get("finalizers"),
                p["metadata"].get("ownerReferences"),
                p.get("status", {}).get("phase"),
            )
            for p in pods(kube, ns, "big")
        ]
        raise AssertionError(f"pods left: {left}") from None
    await until_async(lambda: workload(kube, ns, "big-gang-0") is None, 60)


async def test_a_job_naming_a_local_queue_that_does_not_exist_gets_no_pods(
    cluster: Cluster, operator: Operator, kube: Kube, quota: Quota
) -> None:
    ns = cluster.namespace
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), queued("lost", ns, "no-such-queue", 20))
    job = await wait_status(kube, ns, "lost", lambda s: condition({"status": s}, "QueueUnavailable") is not None, 30)
    missing = condition(job, "QueueUnavailable")
    assert missing is not None and missing["reason"] == "LocalQueueNotFound", missing
    assert "LocalQueue 'no-such-queue' does not exist" in missing["message"], missing
    await asyncio.sleep(2)
    assert await call(pods, kube, ns, "lost") == []
