"""kopf wiring only: every handler hands the job to `Reconciler.reconcile`."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from zerotrain.operator import naming
from zerotrain.operator.kube import KubeError
from zerotrain.operator.reconcile import Reconciler, Result

from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


def make_registry(reconciler: Reconciler) -> kopf.OperatorRegistry:
    """A fresh registry (never kopf's global one), so tests can run several operators in one process."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        # Scanning lists namespaces and CRDs, which needs cluster-wide RBAC the chart does not grant.
        settings.scanning.disabled = True
        settings.posting.enabled = True
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return reconciler.kube.connection_info(**kwargs)

    def run(namespace: str, name: str, permanent: bool) -> None:
        try:
            outcome = reconciler.reconcile(namespace, name)
        except KubeError as e:
            raise kopf.TemporaryError(f"API error: {e}", delay=min(60, 2 * reconciler.settings.api_retries)) from e
        if permanent and outcome is not None and outcome.result == Result.INVALID:
            # The status and an Event already say why; retrying cannot fix a spec.
            raise kopf.PermanentError(outcome.message)

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    def on_job(namespace: str, name: str, **_: Any) -> None:
        run(namespace, name, permanent=True)

    @kopf.timer(*resource, interval=reconciler.settings.resync_seconds, registry=registry)
    def resync(namespace: str, name: str, **_: Any) -> None:
        run(namespace, name, permanent=False)

    @kopf.on.event("", "v1", "pods", labels={naming.LABEL_JOB: kopf.PRESENT}, registry=registry)
    def on_pod(namespace: str, labels: dict[str, str], **_: Any) -> None:
        try:
            reconciler.reconcile(namespace, labels[naming.LABEL_JOB])
        except KubeError as e:  # event handlers are not retried; the resync timer catches up
            log.warning("reconcile after a pod event failed: %s", e)

    @kopf.on.delete(*resource, optional=True, registry=registry)
    def on_delete(namespace: str, name: str, **_: Any) -> None:
        reconciler.metrics.set_phase((namespace, name), None)

    return registry
