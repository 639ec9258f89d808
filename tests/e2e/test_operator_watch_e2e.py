"""The operator watches only its own pods, filtered by the API server (not every pod, dropped client-side)."""

from __future__ import annotations

import urllib.parse

import pytest

from zerotrain.operator.children import naming
from zerotrain.operator.client.kube import Kube

from .cluster import Cluster
from .conftest import Operator
from .test_operator_e2e import start_job


async def test_pod_watch_and_list_carry_the_operators_label_selector(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    if cluster.emulator is None:
        pytest.skip("reads the emulator's record of requests")
    await start_job(kube, cluster.namespace, "watched-pods")
    pod_reads = [s for s in cluster.emulator.served if s.call.resource == "pods" and s.call.verb in ("list", "watch")]
    assert pod_reads, "the operator never listed or watched pods"
    for served in pod_reads:
        selector = urllib.parse.parse_qs(served.query).get("labelSelector", [""])[0]
        terms = set(selector.split(","))
        assert f"{naming.LABEL_MANAGED_BY}={naming.MANAGER}" in terms or f"{naming.LABEL_JOB}=watched-pods" in terms, (
            f"{served.method} {served.path}?{served.query} reads pods without the operator's selector"
        )


async def test_a_job_costs_kopf_no_write(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    """kopf only watches the jobs: no progress or last-handled annotation is patched onto them (one request and one
    more event per job)."""
    if cluster.emulator is None:
        pytest.skip("reads the emulator's record of requests")
    await start_job(kube, cluster.namespace, "unannotated")
    writes = [
        f"{s.method} {s.path}"
        for s in cluster.emulator.served
        if s.user_agent.startswith("kopf") and s.call.verb not in ("get", "list", "watch")
    ]
    assert writes == []
