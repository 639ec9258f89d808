"""kopf wiring only: the jobs' watch events go into the cache and ask `Reconciler` for passes."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf

from zerotrain.operator.controller.reconcile import Reconciler
from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """No state kept: no change handler is registered, so kopf never compares a job with its last handled state,
    yet it fetched and built that state on every job event (a deep copy, and annotation keys built and marked),
    the largest part of what a job event cost."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings for a standalone, namespaced-RBAC operator."""
    settings.peering.standalone = True
    # Scanning lists namespaces and CRDs, which needs cluster-wide RBAC the chart does not grant.
    settings.scanning.disabled = True
    settings.posting.enabled = True
    # No change handler is registered, so kopf stores no progress; were one added, kopf's default would write it
    # to status.kopf, which the CRD's structural status schema prunes: annotations would hold it instead.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    # kopf watches only the jobs: the pods and the cached children are followed by operator.client.reflector.
    settings.networking.request_timeout = 60


def job_essence(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a job a pass acts on, besides its status (which the passes write, and the runtime's rank 0)."""
    md = body.get("metadata") or {}
    # The uid: a job deleted and created again under its name, its DELETED missed in a watch gap, is a new job.
    keys = ("uid", "generation", "labels", "annotations", "deletionTimestamp", "finalizers")
    return (body.get("spec"), *(md.get(k) for k in keys))


def make_registry(reconciler: Reconciler) -> kopf.OperatorRegistry:
    """A fresh registry (never kopf's global one), so tests can run several operators in one process.

    The jobs' events are what the operator takes from kopf (with its login, its start-up settings and its
    lifecycle): each adds the job to the work queue (`Reconciler.ask`; the workers run the pass, and retry a failed
    one with the job's back-off) unless only the status changed. kopf's change
    handlers (create, update, resume) are not used: they stored their progress and the last handled spec in an
    annotation patch per job, and that patch's own event, and ran each pass on kopf's executor. No handler needs
    a finalizer, so kopf puts none on the jobs.
    """
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    kopf.on.startup(registry=registry)(configure)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return reconciler.kube.connection_info(**kwargs)

    cache = reconciler.cache
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}

    # Async, so it runs in kopf's event loop at once, never waiting for a thread.
    @kopf.on.event(*resource, registry=registry)
    async def on_job_event(
        type: str | None, event: Mapping[str, Any], namespace: str | None, name: str, **_: Any
    ) -> None:
        if namespace is None:  # the resource is namespaced; kopf types allow None for cluster objects
            return
        key, body = (namespace, name), dict(event["object"])
        # The cache is the one list of jobs: the periodic resync asks for a pass of each (type None: the initial
        # listing).
        if type == "DELETED":
            cache.drop_job(body)
            seen.pop(key, None)
            reconciler.metrics.forget(key)
            reconciler.ask(key)  # finds it gone, and drops what the reconciler kept for it
            return
        cache.put_job(body)
        essence = job_essence(body)
        if seen.get(key) != essence:  # the initial listing (resume), a new job, or a change to act on
            seen[key] = essence
            reconciler.ask(key)

    return registry
