"""Two operator replicas with leader election: one reconciles, the other stays passive until the first stops, then
takes over within a lease."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any

from zerotrain.operator.app import lead_then_operate
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.operator.client.leader import LEASE_API
from zerotrain.operator.metrics import OperatorMetrics
from zerotrain.operator.settings import OperatorSettings

from .cluster import Cluster, until_async
from .test_operator_e2e import call, start_job

LEASE = "zerotrain-operator-e2e"


class Replica:
    """One operator replica: its own client, metrics and stop flag, running in a thread."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.settings = OperatorSettings(
            namespaces=[cluster.namespace],
            resync_seconds=0.5,
            restart_backoff_seconds=0.2,
            api_retry_base_seconds=0.05,
            leader_election=True,
            lease_namespace=cluster.namespace,
            lease_name=LEASE,
            lease_seconds=2.0,
            lease_renew_seconds=0.3,
            lease_retry_seconds=0.2,
            identity=name,
        )
        self.kube = Kube(cluster.configuration, retries=3, retry_base_seconds=0.05)
        self.metrics = OperatorMetrics()
        self.stop = threading.Event()
        self.result: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.result.append(lead_then_operate(self.kube, self.settings, self.stop, self.metrics, liveness=False))

    def passes(self) -> float:
        return sum(self.metrics.reconciles.labels(result=r)._value.get() for r in ("ok", "invalid", "gone", "error"))

    async def shutdown(self) -> None:
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 15)
        self.kube.close()
        assert not self.thread.is_alive(), "the replica did not stop"


def holder(kube: Kube, ns: str) -> str:
    try:
        return str(kube.request("GET", path_of(LEASE_API, "leases", ns, LEASE))["spec"].get("holderIdentity") or "")
    except KubeError:
        return ""


async def test_the_standby_stays_passive_until_the_leader_stops(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    first, second = Replica(cluster, "replica-a"), Replica(cluster, "replica-b")
    replicas: list[Any] = [first]
    try:
        first.thread.start()
        await until_async(lambda: holder(kube, ns) == "replica-a", timeout=10)
        await cluster.wait_watching()
        second.thread.start()
        replicas.append(second)
        await start_job(kube, ns, "led")
        await asyncio.sleep(2 * first.settings.lease_seconds)  # the standby sees the lease renewed, and waits
        assert await call(holder, kube, ns) == "replica-a"
        assert first.passes() > 0 and second.passes() == 0, "the standby reconciled"
        await first.shutdown()  # releases the lease
        assert first.result == [0]
        await until_async(lambda: holder(kube, ns) == "replica-b", timeout=5)
        await start_job(kube, ns, "led-after")  # only the new leader is left to create its gang
        assert second.passes() > 0
    finally:
        for r in replicas:
            if r.thread.is_alive():
                await r.shutdown()


async def test_a_leader_that_loses_its_lease_stops(cluster: Cluster, kube: Kube) -> None:
    ns = cluster.namespace
    cluster.kopf_runs = False  # deposed right after it leads: under load kopf may not have sent a request yet
    leader = Replica(cluster, "replica-a")
    leader.thread.start()
    try:
        await until_async(lambda: holder(kube, ns) == "replica-a", timeout=10)
        # Another replica took over (e.g. this one was partitioned away long enough): this one must step down.
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        patch = {"spec": {"holderIdentity": "replica-z", "renewTime": now, "leaseDurationSeconds": 60}}
        await call(
            kube.request, "PATCH", path_of(LEASE_API, "leases", ns, LEASE), patch, "application/merge-patch+json"
        )
        await asyncio.to_thread(leader.thread.join, 15)
        assert leader.result == [1], "a replica that lost the lease must stop with a failure status"
        assert await call(holder, kube, ns) == "replica-z", "the deposed leader must not release another's lease"
    finally:
        if leader.thread.is_alive():
            await leader.shutdown()
        leader.kube.close()
