"""A pod's launcher follows its own pod (`runtime.job.pod_rounds`) with the job's runtime ServiceAccount, as the
operator's Role grants it: the gang label passing its round stops its ranks, the round annotation starts the next or
ends it, and its round's end goes onto the pod. On a real server this is RBAC's own check of a watch by
`fieldSelector=metadata.name` against `resourceNames`; a pod of another name stays out of reach."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, naming
from zerotrain.operator.children.supporting import build_rbac
from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.pod_contract import ROUND_ANNOTATION, ROUND_END_ANNOTATION, ROUND_EXIT, SERVICE_ACCOUNT_DIR_ENV
from zerotrain.pod_rounds import parse_round_end
from zerotrain.runtime.job.pod_rounds import PodRounds
from zerotrain.spec import PLURAL

from .cluster import Cluster, project_token, until_async
from .test_operator_e2e import JOBS, job_manifest

SPEC = {"replicas": 2, "nprocPerNode": 1, "checkpoint": {"claimName": "ckpt"}}


async def until_set(event: asyncio.Event | object, timeout: float = 10.0) -> bool:
    return bool(await until_async(lambda: event.is_set(), timeout))  # type: ignore[attr-defined]


async def test_a_launcher_follows_its_pod_and_reports_its_round_there(
    cluster: Cluster, kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns, name = cluster.namespace, "rounds"
    cluster.kopf_runs = False
    # The job and what the operator would make for it (no operator runs: it would take the test's moves for its own).
    job_body = await asyncio.to_thread(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, **SPEC))
    job = builders.JobRef(name, ns, job_body["metadata"]["uid"])
    spec = parse_spec(job_body["spec"])
    for obj in build_rbac(job, spec):
        await asyncio.to_thread(kube.create, obj)
    pod = await asyncio.to_thread(kube.create, builders.build_pod(job, spec, 1, 0))
    await asyncio.to_thread(project_token, cluster, kube, naming.service_account_name(name), pod, tmp_path / "sa")
    monkeypatch.setenv(SERVICE_ACCOUNT_DIR_ENV, str(tmp_path / "sa"))
    me = pod["metadata"]["name"]
    rounds = PodRounds(ns, me, str(cluster.configuration.host))
    try:
        assert await asyncio.to_thread(rounds.first_round) == 0
        stop = rounds.stop_event(0)
        await asyncio.sleep(0.5)
        assert not stop.is_set()
        # The operator's move into gang 1: the round's ranks are to stop.
        await asyncio.to_thread(kube.patch_pod, ns, me, {"metadata": {"labels": {naming.LABEL_GANG: "1"}}})
        assert await until_set(stop)
        line = "stopped: the operator restarts the gang in place (exit status 137)"
        await asyncio.to_thread(rounds.report_end, 0, 137, line)
        stored = await asyncio.to_thread(kube.request, "GET", path_of("v1", "pods", ns, me))
        ended = parse_round_end(stored["metadata"]["annotations"][ROUND_END_ANNOTATION])
        assert ended is not None and (ended.round, ended.exit_code, ended.message) == (0, 137, line)
        # Word to start round 1, then to exit.
        waiting = asyncio.ensure_future(asyncio.to_thread(rounds.next_round, 0))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await asyncio.to_thread(kube.patch_pod, ns, me, {"metadata": {"annotations": {ROUND_ANNOTATION: "1"}}})
        assert await asyncio.wait_for(waiting, 10) == 1
        stop = rounds.stop_event(1)
        await asyncio.to_thread(kube.patch_pod, ns, me, {"metadata": {"annotations": {ROUND_ANNOTATION: ROUND_EXIT}}})
        assert await until_set(stop)
        assert await asyncio.to_thread(rounds.next_round, 1) is None
    finally:
        rounds.close()
    # Another pod's name is out of the Role's reach (a real server refuses; the emulator knows no such pod).
    other = PodRounds(ns, "someone-else", str(cluster.configuration.host))
    try:
        assert await asyncio.to_thread(other.first_round, 10.0) is None
    finally:
        other.close()
