"""The operator process: kopf plus the liveness and metrics endpoints, torn down cleanly."""

from __future__ import annotations

import asyncio
import logging
import threading

import kopf

from zerotrain.operator.handlers import make_registry
from zerotrain.operator.kube import Kube
from zerotrain.operator.metrics import OperatorMetrics
from zerotrain.operator.reconcile import Reconciler
from zerotrain.operator.resync import Resync
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
    reconciler = Reconciler(kube=kube, settings=settings, metrics=metrics or OperatorMetrics())
    resync = Resync(settings.resync_seconds, reconciler.reconcile)
    endpoint = f"http://{settings.bind_address}:{settings.health_port}/healthz" if liveness else None
    resync.start()
    try:
        await kopf.operator(
            registry=make_registry(reconciler, resync),
            standalone=True,
            namespaces=list(settings.namespaces),
            clusterwide=not settings.namespaces,
            liveness_endpoint=endpoint,
            stop_flag=stop_flag,
        )
    finally:
        resync.stop()
        reconciler.close()


def main(settings: OperatorSettings, kubeconfig: str | None = None) -> int:
    """`zerotrain operator`: connect (in-cluster, else kubeconfig), serve /metrics, run kopf."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kube = Kube.connect(kubeconfig, retries=settings.api_retries, retry_base_seconds=settings.api_retry_base_seconds)
    metrics = OperatorMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.bind_address)
    scope = ", ".join(settings.namespaces) or "all namespaces"
    log.info("zerotrain operator: watching %s; /healthz on :%d", scope, settings.health_port)
    try:
        asyncio.run(operate(kube, settings, metrics=metrics))
    finally:
        metrics.stop()
        kube.close()
    return 0
