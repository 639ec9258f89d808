"""kopf wiring only: every handler hands the job to `Reconciler.reconcile`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from zerotrain.operator.kube import KubeError
from zerotrain.operator.reconcile import Reconciler, Result
from zerotrain.operator.resync import Resync
from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings for a standalone, namespaced-RBAC operator."""
    settings.peering.standalone = True
    # Scanning lists namespaces and CRDs, which needs cluster-wide RBAC the chart does not grant.
    settings.scanning.disabled = True
    settings.posting.enabled = True
    # kopf's default also writes handler progress to status.kopf, which the CRD's structural status schema
    # prunes (and which would race the operator's own status writes); annotations hold it instead.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    settings.watching.server_timeout = 300
    # kopf watches only the jobs: the pods and the cached children are followed by operator.reflector.
    settings.networking.request_timeout = 60


def make_registry(reconciler: Reconciler, resync: Resync | None = None) -> kopf.OperatorRegistry:
    """A fresh registry (never kopf's global one), so tests can run several operators in one process.

    No handler here needs a finalizer (no timers, no daemons, the delete handler is optional), so kopf puts
    none on the jobs, and removes the one an older release left.
    """
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    kopf.on.startup(registry=registry)(configure)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return reconciler.kube.connection_info(**kwargs)

    def run(namespace: str | None, name: str, permanent: bool) -> None:
        if namespace is None:  # the resource is namespaced; kopf types allow None for cluster objects
            return
        try:
            outcome = reconciler.reconcile(namespace, name, hand_off=True)
        except KubeError as e:
            # kube.py already retried with back-off; kopf retries the handler at the next step of that back-off.
            s = reconciler.settings
            raise kopf.TemporaryError(f"API error: {e}", delay=s.api_retry_base_seconds * 2**s.api_retries) from e
        if permanent and outcome is not None and outcome.result == Result.INVALID:
            # The status and an Event already say why; retrying cannot fix a spec.
            raise kopf.PermanentError(outcome.message)

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    def on_job(namespace: str | None, name: str, **_: Any) -> None:
        run(namespace, name, permanent=True)

    cache = reconciler.cache

    # kopf calls event handlers before the create/update/resume ones of the same event: the pass those run reads
    # the cache this has just updated. The handlers that only update the cache are async, so they run in kopf's
    # event loop at once instead of waiting for an executor thread that passes may all be holding.
    @kopf.on.event(*resource, registry=registry)
    async def on_job_event(
        type: str | None, event: Mapping[str, Any], namespace: str | None, name: str, **_: Any
    ) -> None:
        if namespace is None:
            return
        if cache is not None:
            if type == "DELETED":
                cache.drop_job(dict(event["object"]))
            else:
                cache.put_job(dict(event["object"]))
        # The periodic resync covers exactly the jobs the watch has shown (type None: the initial listing).
        if resync is not None:
            resync.seen((namespace, name), present=type != "DELETED")

    @kopf.on.delete(*resource, optional=True, registry=registry)
    def on_delete(namespace: str | None, name: str, **_: Any) -> None:
        reconciler.metrics.forget((namespace or "", name))

    return registry
