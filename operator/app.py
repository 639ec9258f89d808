"""The operator process: kopf plus the liveness and metrics endpoints, torn down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import os
import signal
import socket
import threading
from typing import Any

import kopf

from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.kube import Kube
from zerotrain.operator.client.leader import LeaderElector, LeaseTimings
from zerotrain.operator.client.rate_limit import RequestBudget
from zerotrain.operator.client.reflector import reflectors, stop_all
from zerotrain.operator.client.resync import Resync
from zerotrain.operator.controller.reconcile import Reconciler
from zerotrain.operator.handlers import make_registry
from zerotrain.operator.metrics import OperatorMetrics
from zerotrain.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


async def operate(
    kube: Kube,
    settings: OperatorSettings,
    stop_flag: threading.Event | None = None,
    metrics: OperatorMetrics | None = None,
    liveness: bool = True,
) -> None:
    """Run the operator until `stop_flag` is set (or forever); the caller owns and closes `kube`."""
    cache = ObjectCache()
    reconciler = Reconciler(kube=kube, settings=settings, metrics=metrics or OperatorMetrics(), cache=cache)
    kube.observer = reconciler.metrics
    resync = Resync(
        settings.resync_seconds,
        reconciler.ask,
        known=cache.job_keys,
        lister=lambda: reconciler.relist_jobs(list(settings.namespaces)),
        relist_seconds=settings.relist_seconds,
    )
    endpoint = f"http://{settings.bind_address}:{settings.health_port}/healthz" if liveness else None
    # Watches hold a connection for minutes: a client of their own, so they take none of the budget's pool.
    watch_kube = kube.unbudgeted()
    watch_kube.observer = reconciler.metrics
    scopes: list[str | None] = list(settings.namespaces) or [None]
    watches = reflectors(watch_kube, cache, scopes, reconciler.ask)
    for w in watches:
        w.start()
    resync.start()
    try:
        await kopf.operator(
            registry=make_registry(reconciler),
            standalone=True,
            namespaces=list(settings.namespaces),
            clusterwide=not settings.namespaces,
            liveness_endpoint=endpoint,
            stop_flag=_awaitable(stop_flag),
        )
    finally:
        resync.stop()
        stop_all(watches)
        watch_kube.close()
        reconciler.close()


class StandbyHealth:
    """/healthz for a standby replica, which runs no kopf (and so no kopf liveness endpoint) until it leads."""

    def __init__(self, address: str, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/healthz" else 404)
                self.end_headers()
                self.wfile.write(b"standby\n")

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((address, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, lambda *_: stop.set()) for s in _SIGNALS}


def _restore_signals(previous: dict[int, Any]) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


def identity(settings: OperatorSettings) -> str:
    return settings.identity or f"{socket.gethostname()}-{os.getpid()}"


def lead_then_operate(
    kube: Kube,
    settings: OperatorSettings,
    stop: threading.Event,
    metrics: OperatorMetrics | None = None,
    liveness: bool = True,
) -> int:
    """Wait for the Lease (serving /healthz meanwhile), then operate while holding it.

    Exit status 1 if the Lease was lost (the pod restarts and becomes a standby), 0 on a clean stop.
    """
    timings = LeaseTimings(settings.lease_seconds, settings.lease_renew_seconds, settings.lease_retry_seconds)
    # A client of its own, outside the request budget: a renewal must not wait behind a gang's creates.
    lease_kube = kube.unbudgeted()
    elector = LeaderElector(lease_kube, settings.lease_namespace, settings.lease_name, identity(settings), timings)
    health = StandbyHealth(settings.bind_address, settings.health_port) if liveness else None
    log.info(
        "leader election: %s waits for lease %s/%s", elector.identity, settings.lease_namespace, settings.lease_name
    )
    try:
        if not elector.acquire(stop):
            lease_kube.close()
            return 0
    finally:
        if health is not None:
            health.close()  # kopf serves /healthz from here on
    elector.hold(stop, on_lost=stop.set)
    try:
        asyncio.run(operate(kube, settings, stop_flag=stop, metrics=metrics, liveness=liveness))
    finally:
        stop.set()
        if not elector.lost.is_set():
            elector.release()
        lease_kube.close()
    return 1 if elector.lost.is_set() else 0


def _awaitable(stop: threading.Event | None) -> asyncio.Event | None:
    """`stop` as an asyncio.Event of the running loop.

    kopf would wait on a threading.Event from an executor thread, and asyncio.run does not return until its
    executor is shut down: after kopf stopped on SIGTERM with the event unset, the process would hang.
    """
    if stop is None:
        return None
    flag, loop = asyncio.Event(), asyncio.get_running_loop()

    def relay() -> None:
        stop.wait()
        with contextlib.suppress(RuntimeError):  # the loop may be closed by then
            loop.call_soon_threadsafe(flag.set)

    threading.Thread(target=relay, name="zerotrain-stop-relay", daemon=True).start()
    return flag


def main(settings: OperatorSettings, kubeconfig: str | None = None) -> int:
    """`zerotrain operator`: connect (in-cluster, else kubeconfig), serve /metrics, run kopf."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube = Kube.connect(
        kubeconfig,
        retries=settings.api_retries,
        retry_base_seconds=settings.api_retry_base_seconds,
        budget=RequestBudget(settings.api_qps, settings.api_burst, settings.api_connections),
    )
    metrics = OperatorMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.bind_address)
    scope = ", ".join(settings.namespaces) or "all namespaces"
    log.info("zerotrain operator: watching %s; /healthz on :%d", scope, settings.health_port)
    try:
        if settings.leader_election:
            # kopf handles SIGTERM only once it runs; a standby waiting for the Lease must stop cleanly too.
            stop = threading.Event()
            previous = _stop_on_signals(stop)
            try:
                return lead_then_operate(kube, settings, stop, metrics)
            finally:
                _restore_signals(previous)
        asyncio.run(operate(kube, settings, metrics=metrics))
    finally:
        metrics.stop()
        kube.close()
    return 0
