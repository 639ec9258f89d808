"""kopf wiring only: every handler hands the job to `Reconciler.reconcile`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from zerotrain.operator import naming
from zerotrain.operator.cache import ObjectCache
from zerotrain.operator.kube import CACHED_CHILDREN, KubeError
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
    # Watch only our children, filtered by the API server: in a busy namespace (or cluster-wide) the operator would
    # otherwise receive and drop every other object's events. (Pods are watched by operator.pod_watch, not kopf.)
    for api_version, plural in CACHED_CHILDREN:
        group, version = _group_version(api_version)
        settings.watching.label_selectors[group, version, plural] = naming.CHILD_SELECTOR
    settings.networking.request_timeout = 60


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _watch_into(registry: kopf.OperatorRegistry, cache: ObjectCache, api_version: str, plural: str) -> None:
    """Keep the cache's copy of the operator's children of one kind as their watch shows them."""
    group, version = _group_version(api_version)

    @kopf.on.event(group, version, plural, labels={naming.LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def on_child(type: str | None, event: Mapping[str, Any], **_: Any) -> None:
        if type == "DELETED":
            cache.drop_child(plural, dict(event["object"]))
        else:
            cache.put_child(plural, dict(event["object"]))


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

    if cache is not None:
        for api_version, plural in CACHED_CHILDREN:
            _watch_into(registry, cache, api_version, plural)

    @kopf.on.delete(*resource, optional=True, registry=registry)
    def on_delete(namespace: str | None, name: str, **_: Any) -> None:
        reconciler.metrics.forget((namespace or "", name))

    return registry
