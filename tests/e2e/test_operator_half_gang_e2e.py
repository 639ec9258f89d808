"""A gang half created when the operator stopped (its status never written) is completed by the next operator from the
pods that exist: the missing ranks created, the existing pods kept, nothing created twice."""

from __future__ import annotations

from zerotrain.operator.kube import Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster
from .conftest import running_operator
from .test_operator_e2e import JOBS, call, condition, job_manifest, pods, wait_pods, wait_status


async def test_a_half_created_gang_is_completed_not_duplicated(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    async with running_operator(cluster, [ns]):
        await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest("half", ns, replicas=4))
        await wait_pods(kube, ns, "half", 4)
    # What a crash between the second and third pod create leaves: two pods, no status.
    for name in ("half-worker-2", "half-worker-3"):
        await call(kube.request, "DELETE", path_of("v1", "pods", ns, name))
    await call(
        kube.request,
        "PATCH",
        path_of(JOBS, PLURAL, ns, "half", "status"),
        {"status": None},
        "application/merge-patch+json",
    )
    kept = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await call(pods, kube, ns, "half")}
    assert sorted(kept) == ["half-worker-0", "half-worker-1"]
    async with running_operator(cluster, [ns]):
        found = await wait_pods(kube, ns, "half", 4)
        job = await wait_status(kube, ns, "half", lambda s: s.get("restarts", {}).get("total") == 0 and s.get("phase"))
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in found if p["metadata"]["name"] in kept} == kept
    assert condition(job, "ChildWriteFailed") is None or condition(job, "ChildWriteFailed")["status"] == "False"
    assert job["status"]["restarts"]["total"] == 0
