"""A gang half created when the operator stopped (its status never written) is completed by the next operator from the
pods that exist: the missing ranks created, the existing pods kept, nothing created twice."""

from __future__ import annotations

from zerotrain.operator.client.kube import Kube, path_of
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


async def test_a_gang_larger_than_a_pass_is_created_over_several(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    async with running_operator(cluster, [ns], max_pod_creates_per_pass=3):
        await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest("wide7", ns, replicas=7))
        await wait_pods(kube, ns, "wide7", 7)
        job = await wait_status(
            kube, ns, "wide7", lambda s: (condition({"status": s}, "Created") or {}).get("status") == "True"
        )
    assert condition(job, "Created")["reason"] == "GangCreated"
    assert job["status"]["restarts"]["total"] == 0, job["status"]["restarts"]
    if cluster.emulator is not None:  # the creates came in passes of at most 3, a status write between them
        calls = [s.call for s in cluster.emulator.served if s.user_agent.startswith("zerotrain-operator")]
        runs, run = [], 0
        for c in calls:
            if (c.resource, c.verb) == ("pods", "create"):
                run += 1
            elif c.resource == "zerotrainingjobs/status" and run:
                runs, run = [*runs, run], 0
        assert runs == [3, 3, 1], runs
    # One ConfigMap for the gang, created once.
    configs = await call(kube.request, "GET", path_of("v1", "configmaps", ns))
    assert [c["metadata"]["name"] for c in configs["items"] if c["metadata"]["name"].startswith("wide7")] == [
        "wide7-config-0"
    ]
