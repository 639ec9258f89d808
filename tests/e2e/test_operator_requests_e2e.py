"""What a pass that must write sends: only the writes. A gang restart re-applies the job's Service and RBAC objects,
compared with the operator's watch-fed copies instead of read back, and recreates the pods and their ConfigMap."""

from __future__ import annotations

import asyncio

import pytest

from zerotrain.operator.client.kube import Kube

from .cluster import Cluster
from .conftest import Operator
from .kubelet import set_pod_phase
from .test_operator_e2e import call, start_job, wait_pods, wait_status


async def test_a_gang_restart_sends_only_writes(cluster: Cluster, operator: Operator, kube: Kube) -> None:
    if cluster.emulator is None:
        pytest.skip("reads the emulator's record of requests (a real server's metrics do not say who asked)")
    ns, emu = cluster.namespace, cluster.emulator
    await start_job(kube, ns, "writes")
    await asyncio.sleep(0.5)  # the watch events of the job's Service and RBAC objects reach the cache
    mark = len(emu.served)
    await call(set_pod_phase, kube, ns, "writes-worker-1", "Failed", 1)
    await wait_pods(kube, ns, "writes", 2, gang=1)
    await wait_status(kube, ns, "writes", lambda s: s.get("restarts", {}).get("total") == 1)
    ours = [s for s in emu.served[mark:] if s.user_agent.startswith("zerotrain-operator")]
    reads = [f"{s.method} {s.path}" for s in ours if s.call.verb in ("get", "list")]
    assert reads == [], reads
    written = {(s.call.resource, s.call.verb) for s in ours}
    assert {("pods", "delete"), ("pods", "create"), ("configmaps", "create")} <= written, written
