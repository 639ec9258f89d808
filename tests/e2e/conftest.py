"""Fixtures: a cluster (emulator or real), the real kopf operator in its own thread, a test client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import kmock
import pytest

from zerotrain.operator.app import operate
from zerotrain.operator.client.api_calls import API_CALLS, LEADER_CALLS
from zerotrain.operator.client.kube import Kube
from zerotrain.operator.metrics import OperatorMetrics
from zerotrain.operator.settings import OperatorSettings

from .cluster import (
    KUBECONFIG_ENV,
    OPERATOR_AGENTS,
    Cluster,
    real_cluster_setup,
    real_cluster_teardown,
)
from .emulator import ZeroEmulator


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    path = os.environ.get(KUBECONFIG_ENV)
    if path:
        c = await asyncio.to_thread(real_cluster_setup, path)
        yield c
        await asyncio.to_thread(real_cluster_teardown, c)
        return
    async with ZeroEmulator() as emu, kmock.Server(emu):
        import kubernetes

        cfg = kubernetes.client.Configuration()
        cfg.host = str(emu.url).rstrip("/")
        cluster = Cluster(cfg, "default", emu)
        yield cluster
        served = [s for s in emu.served if s.user_agent.startswith(OPERATOR_AGENTS)]
        if cluster.kopf_runs:
            assert any(s.user_agent.startswith("kopf") for s in served), "kopf's own requests were not recorded"
        undeclared = sorted(
            {f"{s.call} ({s.method} {s.path})" for s in served if s.call not in API_CALLS | LEADER_CALLS}
        )
        assert not undeclared, f"operator made API calls missing from api_calls.API_CALLS: {undeclared}"


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Kube]:
    """The test's own client (closed at the end: an open one delays the server's shutdown by 5 s, G2)."""
    client = cluster.client()
    yield client
    client.close()


@dataclass
class Operator:
    settings: OperatorSettings
    metrics: OperatorMetrics
    kube: Kube


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, namespaces: list[str], **overrides: object) -> AsyncIterator[Operator]:
    """The real operator: kopf in its own thread and event loop (G1), fast timers for tests."""
    fast: dict[str, object] = {
        "resync_seconds": 0.5,
        "restart_backoff_seconds": 0.2,
        "max_restart_backoff_seconds": 1.0,
        "api_retry_base_seconds": 0.05,
    }
    settings = OperatorSettings.model_validate({"namespaces": namespaces, **fast, **overrides})
    kube = Kube(cluster.configuration, retries=3, retry_base_seconds=0.05)
    metrics = OperatorMetrics()
    stop = threading.Event()
    thread = threading.Thread(
        target=asyncio.run,
        args=(operate(kube, settings, stop_flag=stop, metrics=metrics, liveness=False),),
        daemon=True,
    )
    thread.start()
    try:
        await cluster.wait_watching()
        yield Operator(settings, metrics, kube)
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 10)
        kube.close()
    assert not thread.is_alive(), "the operator did not stop within 10 s"


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[Operator]:
    """The operator watching the test namespace."""
    async with running_operator(cluster, [cluster.namespace]) as op:
        yield op
