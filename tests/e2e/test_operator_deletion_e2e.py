"""Jobs carry no finalizer: deleting a job (or its namespace, or the CRD) never waits for the operator."""

from __future__ import annotations

from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster, until_async
from .conftest import running_operator
from .test_operator_e2e import JOBS, call, get_job, job_manifest, pods, start_job

KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # what releases before this one left on every job


async def test_job_deletes_while_the_operator_is_stopped(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    async with running_operator(cluster, [ns]):
        await start_job(kube, ns, "orphanless")
        job = await call(get_job, kube, ns, "orphanless")
        assert not job["metadata"].get("finalizers"), job["metadata"].get("finalizers")
    # The operator is gone (uninstalled, crashed, scaled to 0): the deletion must not hang on it.
    await call(kube.delete_job, ns, "orphanless")
    await until_async(lambda: get_job(kube, ns, "orphanless") is None, timeout=10)
    # Children follow through owner references (the real garbage collector can take ~40 s after a fresh start).
    await until_async(lambda: not pods(kube, ns, "orphanless"), timeout=60)


async def test_the_finalizer_an_older_release_left_is_removed(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    manifest = job_manifest("legacy", ns)
    manifest["metadata"]["finalizers"] = [KOPF_FINALIZER]
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), manifest)
    async with running_operator(cluster, [ns]):
        await until_async(lambda: not (get_job(kube, ns, "legacy") or {})["metadata"].get("finalizers"), timeout=15)
    await call(kube.delete_job, ns, "legacy")
    await until_async(lambda: get_job(kube, ns, "legacy") is None, timeout=10)
