"""The operator end to end: real kopf, real `kubernetes` client, the KMock emulator or a real cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml

from zerotrain.manifest import parse_job
from zerotrain.operator.children import naming
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

from .cluster import OPERATOR_AGENTS, Cluster, job_reads_served, until_async
from .conftest import Operator, running_operator
from .kubelet import set_pod_phase

JOBS = f"{GROUP}/{VERSION}"
# On a real cluster no node matches, so no kubelet touches the pods: the test plays the kubelet.
NO_NODE = {"nodeSelector": {"zerotrain.dev/e2e": "no-such-node"}}


def job_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    base = {
        "image": "zerotrain:test",
        "entrypoint": "examples.tiny:build",
        "replicas": 2,
        "nprocPerNode": 2,
        "scheduling": NO_NODE,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**base, **spec},
    }


async def call(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def get_job(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    return kube.get_job(ns, name)


def pods(kube: Kube, ns: str, job: str) -> list[dict[str, Any]]:
    return kube.list_job_pods(ns, job).items


def condition(job: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((job or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), None)


async def wait_status(kube: Kube, ns: str, name: str, pred: Any, timeout: float = 10.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = get_job(kube, ns, name)
        return job if job and pred(job.get("status") or {}) else None

    return await until_async(check, timeout)


async def wait_pods(kube: Kube, ns: str, job: str, count: int, gang: int = 0) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        found = [p for p in pods(kube, ns, job) if not p["metadata"].get("deletionTimestamp")]
        ok = len(found) == count and all(p["metadata"]["labels"][naming.LABEL_GANG] == str(gang) for p in found)
        return found if ok else None

    return await until_async(check)


async def wait_no_pods(kube: Kube, ns: str, job: str) -> None:
    await until_async(lambda: not [p for p in pods(kube, ns, job) if not p["metadata"].get("deletionTimestamp")])


async def start_job(kube: Kube, ns: str, name: str, **spec: Any) -> list[dict[str, Any]]:
    """Create a job, wait for its gang, and play the kubelet: every pod Running."""
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, **spec))
    replicas = spec.get("replicas", 2)
    created = await wait_pods(kube, ns, name, replicas)
    await asyncio.gather(*(call(set_pod_phase, kube, ns, p["metadata"]["name"], "Running") for p in created))
    await wait_status(kube, ns, name, lambda s: s.get("phase") == "Running")
    return created


def billion(stage: int | str, gpu_memory: str) -> dict[str, Any]:
    """Ψ = 1e9 in fp32 AdamW on 2 pods × 2 GPUs: 16, 10, 7 and 4 GB of model states per rank for stages 0-3."""
    return {"model": {"parameters": 10**9}, "resources": {"gpu": 2, "gpuMemory": gpu_memory}, "zero": {"stage": stage}}


async def gang_config(kube: Kube, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The job manifest the pod's gang reads from its ConfigMap."""
    name = {v["name"]: v for v in pod["spec"]["volumes"]}["zerotrain-config"]["configMap"]["name"]
    config = await call(kube.request, "GET", path_of("v1", "configmaps", ns, name))
    return dict(yaml.safe_load(config["data"][naming.CONFIG_KEY]))


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


async def test_create_makes_children_with_env_and_owner(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    spec = {"model": {"parameters": 1_000_000}, "resources": {"gpu": 2, "gpuMemory": "16Gi"}}
    created = await start_job(kube, ns, "alpha", **spec)
    job = await call(get_job, kube, ns, "alpha")
    uid = job["metadata"]["uid"]
    for p in created:
        rank = int(p["metadata"]["labels"][naming.LABEL_REPLICA])
        env = env_of(p)
        assert env["MASTER_ADDR"] == f"alpha-worker-0.alpha.{ns}.svc"
        assert (env["NODE_RANK"], env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == (str(rank), "2", "2", "4")
        assert env["MASTER_PORT"] == "29500" and env["ZEROTRAIN_JOB_NAME"] == "alpha"
        assert p["metadata"]["ownerReferences"][0]["uid"] == uid
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    children = [
        path_of("v1", "services", ns, "alpha"),
        path_of("v1", "configmaps", ns, "alpha-config-0"),
        path_of("v1", "serviceaccounts", ns, "alpha-runtime"),
        path_of("rbac.authorization.k8s.io/v1", "roles", ns, "alpha-status-reporter"),
        path_of("rbac.authorization.k8s.io/v1", "rolebindings", ns, "alpha-status-reporter"),
    ]
    for path in children:
        obj = await call(kube.request, "GET", path)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid, path
    cm = await call(kube.request, "GET", children[1])
    assert parse_job(yaml.safe_load(cm["data"]["job.yaml"])).spec.world_size == 4
    status = job["status"]
    assert status["ranks"]["running"] == 4 and status["memoryPlan"]["recommendedStage"] == 0
    assert {c["type"]: c["status"] for c in status["conditions"]}["Created"] == "True"
    events = await call(kube.request, "GET", path_of("v1", "events", ns))
    assert {"GangCreated", "AllRanksRunning"} <= {e["reason"] for e in events["items"]}


def operator_writes(kube: Kube, ns: str, job: str) -> dict[str, list[tuple[str, ...]]]:
    """Per object of the job, the managedFields entries of the operator's and kopf's writes.

    A real API server records each writer (manager = its user agent's first part) with the time of its last
    write; the scheduler and kubelet write pods too, so resourceVersions alone cannot tell who wrote.
    """
    paths = [
        path_of(JOBS, PLURAL, ns, job),
        path_of("v1", "services", ns, job),
        path_of("v1", "configmaps", ns, f"{job}-config-0"),
        path_of("v1", "serviceaccounts", ns, f"{job}-runtime"),
        path_of("rbac.authorization.k8s.io/v1", "roles", ns, f"{job}-status-reporter"),
        path_of("rbac.authorization.k8s.io/v1", "rolebindings", ns, f"{job}-status-reporter"),
    ]
    objects = [kube.request("GET", p) for p in paths] + pods(kube, ns, job)
    return {
        f"{o.get('kind', '')}/{o['metadata']['name']}": sorted(
            (m.get("manager", ""), m.get("operation", ""), m.get("subresource", ""), m.get("time", ""))
            for m in o["metadata"].get("managedFields") or []
            if m.get("manager", "").startswith(OPERATOR_AGENTS)
        )
        for o in objects
    }


def requests_sent(operator: Operator) -> float:
    """zerotrain_operator_api_requests_total summed over its labels."""
    families = operator.metrics.registry.collect()
    return sum(
        s.value
        for f in families
        if f.name == "zerotrain_operator_api_requests"
        for s in f.samples
        if s.name.endswith("_total")
    )


async def test_second_pass_writes_nothing(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "steady", replicas=1)
    await asyncio.sleep(1.1)  # let the passes triggered by the last pod update settle (managedFields: 1 s clock)
    before = await call(operator_writes, kube, ns, "steady")
    served = len(cluster.emulator.served) if cluster.emulator is not None else 0
    reads = await call(job_reads_served, cluster) if cluster.emulator is None else 0.0
    sent = requests_sent(operator)
    passes = operator.metrics.reconciles.labels(result="ok")._value.get()
    await asyncio.sleep(1.2)  # at least two resync passes (resync_seconds=0.5)
    assert operator.metrics.reconciles.labels(result="ok")._value.get() >= passes + 2, "the resync did not run"
    # What the operator's own zerotrain_operator_api_requests_total says, on any server.
    assert requests_sent(operator) == sent, "steady passes sent requests"
    if cluster.emulator is None:  # the server's own count: nobody but the operator reads jobs in this window
        assert await call(job_reads_served, cluster) == reads, "steady passes read jobs from the API server"
    assert await call(operator_writes, kube, ns, "steady") == before, "an idle job must not be written to"
    if cluster.emulator is not None:  # no managedFields there: its request record shows no write was attempted
        recent = [s for s in cluster.emulator.served[served:] if s.user_agent.startswith(OPERATOR_AGENTS)]
        assert [s for s in recent if s.call.verb not in ("get", "list", "watch")] == []
        # And what a steady job costs per pass: nothing, its reads served from the watch-fed cache (the relist,
        # every relist_seconds = 300 s, does not come in this window).
        done = operator.metrics.reconciles.labels(result="ok")._value.get() - passes
        ours = [f"{s.method} {s.path}?{s.query}" for s in recent if s.call.verb != "watch"]
        assert done >= 2 and ours == [], f"{len(ours)} requests in {done} steady passes: {ours}"


async def test_failed_rank_restarts_whole_gang(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    first = await start_job(kube, ns, "beta")
    await call(set_pod_phase, kube, ns, "beta-worker-1", "Failed", 1)
    second = await wait_pods(kube, ns, "beta", 2, gang=1)
    assert {p["metadata"]["uid"] for p in second}.isdisjoint(p["metadata"]["uid"] for p in first)
    job = await wait_status(kube, ns, "beta", lambda s: s.get("restarts", {}).get("total") == 1)
    recreated = {"inPlace": 0, "strategy": "Recreate"}  # no checkpoint claim: every pod is created again
    assert job["status"]["restarts"] == {"total": 1, "failures": 1, "byCause": {"Failed": 1}, **recreated}
    assert condition(job, "Restarting")["reason"] == "RankFailed"
    for p in second:
        await call(set_pod_phase, kube, ns, p["metadata"]["name"], "Running")
    job = await wait_status(kube, ns, "beta", lambda s: s.get("phase") == "Running")
    assert condition(job, "Restarting")["status"] == "False"
    assert operator.metrics.restarts.labels(reason="Failed")._value.get() == 1


async def test_eviction_restarts_without_counting(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "gamma", failurePolicy={"backoffLimit": 0})
    await call(set_pod_phase, kube, ns, "gamma-worker-0", "Failed", None, "Evicted")
    await wait_pods(kube, ns, "gamma", 2, gang=1)
    job = await wait_status(kube, ns, "gamma", lambda s: s.get("restarts", {}).get("total") == 1)
    recreated = {"inPlace": 0, "strategy": "Recreate"}  # the evicted pod is gone, and there is no checkpoint claim
    assert job["status"]["restarts"] == {"total": 1, "failures": 0, "byCause": {"Evicted": 1}, **recreated}
    assert job["status"]["phase"] != "Failed"


async def test_backoff_limit_spent_fails_job(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "delta", failurePolicy={"backoffLimit": 1})
    await call(set_pod_phase, kube, ns, "delta-worker-0", "Failed", 1)
    for p in await wait_pods(kube, ns, "delta", 2, gang=1):
        await call(set_pod_phase, kube, ns, p["metadata"]["name"], "Running")
    await call(set_pod_phase, kube, ns, "delta-worker-1", "Failed", 3)
    job = await wait_status(kube, ns, "delta", lambda s: s.get("phase") == "Failed")
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert "exited with code 3" in condition(job, "Failed")["message"]
    assert job["status"]["restarts"]["failures"] == 1
    await asyncio.sleep(0.6)  # a resync later: the gang stays down (the running rank was stopped)
    alive = [p for p in await call(pods, kube, ns, "delta") if p["status"]["phase"] == "Running"]
    assert alive == []
    assert {p["metadata"]["labels"][naming.LABEL_GANG] for p in await call(pods, kube, ns, "delta")} <= {"1"}


async def test_permanent_exit_code_fails_at_once(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "epsilon")
    await call(set_pod_phase, kube, ns, "epsilon-worker-0", "Failed", 2)
    job = await wait_status(kube, ns, "epsilon", lambda s: s.get("phase") == "Failed")
    assert condition(job, "Failed")["reason"] == "PermanentExitCode"
    assert job["status"]["restarts"]["total"] == 0


async def test_a_rank_out_of_memory_fails_the_job_at_once_with_its_account(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "oom", **billion(2, "12G"))
    # What the runtime's launcher writes when a rank could not allocate (`runtime.job.out_of_memory`).
    said = (
        "rank-failed: rank 3 failed first: it exited with status 1: out of memory: rank 3 during backward in unit "
        "blocks.7; it asked for 2.1 GB; it held parameters 4.0 GB, gradients 500.0 MB; raise zero.stage (or use "
        "stage: auto), turn on zero.activationCheckpointing, lower the micro-batch, or give the ranks more memory "
        "(exit status 1)"
    )
    await call(set_pod_phase, kube, ns, "oom-worker-1", "Failed", 1, None, said)
    job = await wait_status(kube, ns, "oom", lambda s: s.get("phase") == "Failed")
    cond = condition(job, "OutOfMemory")
    assert cond["status"] == "True" and condition(job, "Failed")["reason"] == "OutOfMemory"
    assert cond["message"].startswith("pod oom-worker-1 (node rank 1): out of memory: rank 3 during backward")
    assert "more memory; the plan gave stage 2 7.0 GB of 9.6 GB usable per rank" in cond["message"]
    assert job["status"]["restarts"]["total"] == 0, "the same gang would run out again: no back-off spent"


async def test_stage_auto_out_of_memory_moves_up_a_stage_then_recomputes_until_nothing_is_left(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "replan", **billion("auto", "12G"))
    said = "rank-failed: rank 0 failed first: it exited with status 1: out of memory: rank 0 during forward"
    await call(set_pod_phase, kube, ns, "replan-worker-0", "Failed", 1, None, said)
    # The plan chose stage 2; its ranks ran out: the next gang runs stage 3, from the newest checkpoint.
    job = await wait_status(kube, ns, "replan", lambda s: s.get("stage") == 3)
    assert job["status"]["restarts"]["byCause"] == {"OutOfMemory": 1} and job["status"]["restarts"]["failures"] == 0
    assert "stage auto moves to stage 3 or higher" in condition(job, "OutOfMemory")["message"]
    assert condition(job, "StageChosen")["message"].endswith("; stage 2 ran out of memory")
    created = await wait_pods(kube, ns, "replan", 2, gang=1)
    assert (await gang_config(kube, ns, created[0]))["spec"]["zero"]["stage"] == 3
    await asyncio.gather(*(call(set_pod_phase, kube, ns, p["metadata"]["name"], "Running") for p in created))
    job = await wait_status(kube, ns, "replan", lambda s: s.get("phase") == "Running")
    assert condition(job, "OutOfMemory")["status"] == "False"
    # Stage 3 runs out too: auto's last move is to recompute activations in backward.
    await call(set_pod_phase, kube, ns, created[1]["metadata"]["name"], "Failed", 1, None, said)
    job = await wait_status(kube, ns, "replan", lambda s: s.get("activationCheckpointing") is True)
    assert job["status"]["restarts"]["byCause"] == {"OutOfMemory": 2} and job["status"]["stage"] == 3
    assert "stage auto turns on zero.activationCheckpointing at stage 3" in condition(job, "OutOfMemory")["message"]
    created = await wait_pods(kube, ns, "replan", 2, gang=2)
    assert (await gang_config(kube, ns, created[0]))["spec"]["zero"]["activationCheckpointing"] is True
    job = await wait_status(kube, ns, "replan", lambda s: "checkpointing on since" in str(s.get("conditions")))
    assert condition(job, "StageChosen")["message"].endswith(
        "activation checkpointing on since stage 3 ran out of memory"
    )
    # And out of memory again: nothing is left to try.
    await call(set_pod_phase, kube, ns, created[0]["metadata"]["name"], "Failed", 1, None, said)
    job = await wait_status(kube, ns, "replan", lambda s: s.get("phase") == "Failed")
    assert condition(job, "Failed")["reason"] == "OutOfMemory"
    want = "stage auto has no stage above 3 left to try, and activation checkpointing is on"
    assert condition(job, "Failed")["message"].endswith(want)


async def test_suspend_and_resume(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "zeta")
    path = path_of(JOBS, PLURAL, ns, "zeta")
    await call(kube.request, "PATCH", path, {"spec": {"suspend": True}}, "application/merge-patch+json")
    job = await wait_status(kube, ns, "zeta", lambda s: s.get("phase") == "Suspended")
    await wait_no_pods(kube, ns, "zeta")
    assert condition(job, "Suspended")["status"] == "True"
    await call(kube.request, "PATCH", path, {"spec": {"suspend": False}}, "application/merge-patch+json")
    resumed = await wait_pods(kube, ns, "zeta", 2, gang=0)
    job = await wait_status(kube, ns, "zeta", lambda s: s.get("phase") == "Pending")
    assert len(resumed) == 2 and job["status"]["restarts"]["total"] == 0
    assert condition(job, "Suspended")["reason"] == "JobResumed"


async def test_invalid_spec_is_refused_without_pods(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    # The CRD schema accepts this entry point (its form is checked by pydantic only), so a real API server
    # lets it through too and admission is the operator's.
    bad = job_manifest("eta", ns, entrypoint="train")
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), bad)
    job = await wait_status(kube, ns, "eta", lambda s: s.get("phase") == "Failed")
    cond = condition(job, "InvalidSpec")
    assert cond["status"] == "True" and cond["reason"] == "InvalidSpec"
    assert "spec.entrypoint" in cond["message"] and "'train'" in cond["message"]
    await asyncio.sleep(0.6)
    assert await call(pods, kube, ns, "eta") == []
    events = (await call(kube.request, "GET", path_of("v1", "events", ns)))["items"]
    refusals = [e for e in events if e["reason"] == "InvalidSpec" and e["involvedObject"]["name"] == "eta"]
    assert len(refusals) == 1 and refusals[0]["type"] == "Warning", "one Event per transition, no retry loop"


async def test_memory_plan_that_cannot_fit_is_refused(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    spec = {"model": {"parameters": 7_500_000_000}, "resources": {"gpu": 2, "gpuMemory": "16Gi"}, "zero": {"stage": 0}}
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest("theta", ns, **spec))
    job = await wait_status(kube, ns, "theta", lambda s: s.get("phase") == "Failed")
    cond = condition(job, "InvalidSpec")
    assert cond["reason"] == "MemoryPlanDoesNotFit"
    assert "stage 0 needs" in cond["message"] and "replicas" in cond["message"]
    assert job["status"]["memoryPlan"]["parameters"] == 7_500_000_000
    assert await call(pods, kube, ns, "theta") == []


async def test_stage_auto_runs_the_lowest_stage_that_fits_and_says_why(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    # 12 GB GPUs (9.6 GB usable with the 20% headroom) fit stage 2 first.
    created = await start_job(kube, ns, "auto", **billion("auto", "12G"))
    job = await wait_status(kube, ns, "auto", lambda s: s.get("stage") is not None)
    assert job["status"]["stage"] == 2 and job["spec"]["zero"]["stage"] == "auto"
    cond = condition(job, "StageChosen")
    assert cond["status"] == "True" and cond["reason"] == "LowestStageThatFits"
    assert cond["message"] == "stage 2: 7.0 GB of model states of 9.6 GB usable of 12.0 GB; stage 1 would need 10.0 GB"
    # The ranks read a concrete stage from the gang's configuration.
    assert (await gang_config(kube, ns, created[0]))["spec"]["zero"]["stage"] == 2
    events = (await call(kube.request, "GET", path_of("v1", "events", ns)))["items"]
    assert [e["message"] for e in events if e["reason"] == "LowestStageThatFits"] == [cond["message"]]


async def test_stage_auto_that_nothing_fits_names_the_world_size_that_would(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    manifest = job_manifest("toosmall", ns, **billion("auto", "1.5G"))
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), manifest)
    job = await wait_status(kube, ns, "toosmall", lambda s: s.get("phase") == "Failed")
    cond = condition(job, "InvalidSpec")
    assert cond["reason"] == "MemoryPlanDoesNotFit"
    # 16 GB of model states over N ranks within 1.2 GB usable: N >= 14, 7 pods of 2 ranks.
    assert "no stage fits 1.2 GB usable of 1.5 GB per rank with 4 ranks" in cond["message"]
    assert "stage 3 fits with at least 7 replicas (14 ranks)" in cond["message"]
    assert await call(pods, kube, ns, "toosmall") == []


async def test_success_then_ttl_deletes_job(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "iota", replicas=1, ttlSecondsAfterFinished=0)
    await call(set_pod_phase, kube, ns, "iota-worker-0", "Succeeded")
    await until_async(lambda: get_job(kube, ns, "iota") is None)


async def test_deletion_leaves_no_orphans(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "kappa")
    await call(kube.delete_job, ns, "kappa")
    await until_async(lambda: get_job(kube, ns, "kappa") is None and not pods(kube, ns, "kappa"), timeout=30)
    for path in (path_of("v1", "services", ns, "kappa"), path_of("v1", "configmaps", ns, "kappa-config-0")):
        try:
            await until_async(lambda p=path: kube.request("GET", p) is None, timeout=30)  # type: ignore[misc]
        except KubeError as e:
            assert e.status == 404


@pytest.mark.slow
async def test_64_replica_gang(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    created = await start_job(kube, ns, "wide", replicas=64, nprocPerNode=8)
    assert sorted(int(p["metadata"]["labels"][naming.LABEL_REPLICA]) for p in created) == list(range(64))
    assert {env_of(p)["WORLD_SIZE"] for p in created} == {"512"}
    job = await call(get_job, kube, ns, "wide")
    assert job["status"]["ranks"] == {"total": 512, "ready": 512, "running": 512, "succeeded": 0, "failed": 0}


async def test_cluster_wide_operator(cluster: Cluster, kube: Kube) -> None:
    """ZEROTRAIN_NAMESPACES empty: one operator serves every namespace (scanning stays off, see handlers)."""
    async with running_operator(cluster, namespaces=[]):
        await start_job(kube, cluster.namespace, "nu", replicas=1)


async def test_pod_pending_past_startup_timeout_is_reported(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    ns = cluster.namespace
    manifest = job_manifest("xi", ns, replicas=1, scheduling={**NO_NODE, "startupTimeoutSeconds": 1})
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), manifest)
    await wait_pods(kube, ns, "xi", 1)
    job = await wait_status(
        kube, ns, "xi", lambda s: any(c["type"] == "Unschedulable" for c in s.get("conditions", []))
    )
    cond = condition(job, "Unschedulable")
    assert cond["status"] == "True" and cond["reason"] == "StartupTimeout" and "xi-worker-0" in cond["message"]
    await call(set_pod_phase, kube, ns, "xi-worker-0", "Running")
    job = await wait_status(kube, ns, "xi", lambda s: s.get("phase") == "Running")
    assert condition(job, "Unschedulable")["status"] == "False"
