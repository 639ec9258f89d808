"""The operator's pods and cached children, each kind listed once and then followed by a watch from the LIST's
resourceVersion, into the cache.

client-go's reflector: LIST, WATCH from the list's resourceVersion (bookmarks keep it current), resume from the last
version seen when the server ends the stream, LIST again on 410 Gone, back off on errors. A pod event replaces or
removes the pod in the cache and asks for a pass of its job; a child event (ServiceAccount, Role, RoleBinding,
Service) only updates the cache, which the next pass compares its applies with.

These are not kopf's watches because a gang start is thousands of pod events in a few seconds, and kopf spends about
half a millisecond of the process's one interpreter on each (its causes, progress storage, a handler task per
object): as much again as the create that caused the event, so the operator created pods at half a plain client's
pace; and each new job's children were five more such events. Here an event costs a JSON decode and a dict store.
kopf still watches the jobs, whose handlers it runs.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import urllib3

from zerotrain.operator.client import selectors
from zerotrain.operator.client.api_calls import CACHED_CHILDREN
from zerotrain.operator.client.cache import Key, ObjectCache, job_of
from zerotrain.operator.client.kube import Kube, KubeError, Listing, Obj, path_of

log = logging.getLogger(__name__)
GONE = 410
POD_KIND = ("v1", "pods")


class Sink(Protocol):
    """Where a reflector puts what it sees of one kind in one scope. Neither call may block: the next event waits."""

    def listed(self, listing: Listing, relist: bool) -> None:
        """A LIST of the kind: the whole set (`relist`: not the first, so the watch missed events)."""

    def event(self, type: str, obj: Obj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) with the object freshly decoded, the sink's to keep."""


class PodSink:
    """Pods go into the cache; each event, and each job a relist covers, asks for a pass of the pod's job."""

    def __init__(self, cache: ObjectCache, namespace: str | None, changed: Callable[[Key], None]) -> None:
        self.cache, self.namespace, self.changed = cache, namespace, changed

    def listed(self, listing: Listing, relist: bool) -> None:
        jobs = self.cache.pods_listed(self.namespace, listing)
        if relist:  # the watch missed events: every job it covers takes a look (the first time kopf's resume does)
            for job in jobs:
                self.changed(job)

    def event(self, type: str, obj: Obj) -> None:
        if type == "DELETED":
            self.cache.drop_pod(obj)
        else:
            self.cache.put_pod(obj, handed_over=True)
        if (job := job_of(obj)) is not None:
            self.changed(job)


class ChildSink:
    """Children of one kind go into the cache, nothing more (a pass is not wanted for each)."""

    def __init__(self, cache: ObjectCache, plural: str, namespace: str | None) -> None:
        self.cache, self.plural, self.namespace = cache, plural, namespace

    def listed(self, listing: Listing, relist: bool) -> None:
        self.cache.relisted_children(self.plural, self.namespace, listing)

    def event(self, type: str, obj: Obj) -> None:
        if type == "DELETED":
            self.cache.drop_child(self.plural, obj)
        else:
            self.cache.put_child(self.plural, obj, handed_over=True)


def reflectors(
    kube: Kube, cache: ObjectCache, scopes: Sequence[str | None], changed: Callable[[Key], None]
) -> list[Reflector]:
    """The operator's reflectors: its pods and each cached kind of child, in every watched namespace (or all)."""
    out = []
    for namespace in scopes:
        out.append(Reflector(kube, POD_KIND, namespace, PodSink(cache, namespace, changed)))
        out += [Reflector(kube, kind, namespace, ChildSink(cache, kind[1], namespace)) for kind in CACHED_CHILDREN]
    return out


def stop_all(running: Sequence[Reflector], seconds: float = 10.0) -> None:
    """Stop reflectors that share one client: every one is told first, so cutting the client's streams ends each
    for good instead of having the others reconnect; all within one deadline (a thread stuck in a LIST during an
    outage is left behind: the threads are daemons)."""
    for r in running:
        r.tell_stop()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(r.alive() for r in running):
        for kube in {id(r.kube): r.kube for r in running}.values():
            kube.stop_watches()  # a watch that was just starting is cut on the next round
        for r in running:
            r.join(0.05)


class Reflector:
    """One thread following the operator's objects of `kind` (apiVersion, plural) in `namespace` (every namespace:
    None) into `sink`."""

    def __init__(
        self,
        kube: Kube,
        kind: tuple[str, str],
        namespace: str | None,
        sink: Sink,
        timeout_seconds: int = 300,
        max_backoff_seconds: float = 30.0,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.namespace = namespace
        self.sink = sink
        self.timeout_seconds = timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.synced = threading.Event()
        """Set once the first LIST is in the sink (the kind's set in the namespace is complete from then on)."""
        self._stop = threading.Event()
        self._version: str | None = None
        """The resourceVersion to watch from (None: list first)."""
        where = namespace or "all-namespaces"
        self._thread = threading.Thread(target=self._run, name=f"zerotrain-watch-{kind[1]}-{where}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tell_stop(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        stop_all([self])

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, seconds: float) -> None:
        self._thread.join(timeout=seconds)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self._version is None:
                    self._version = self._list(relist=self.synced.is_set())
                if self._follow() or time.monotonic() - started >= 1.0:
                    failures = 0
                    continue
                problem = "the watch ended at once, with no event"  # as client-go, back off: it would spin
            except Exception as e:  # any: a thread that died would leave the cache stale with no word
                if self._stop.is_set():
                    return
                if isinstance(e, KubeError) and e.status == GONE:
                    self._version = None  # compacted away: list again, as client-go does
                    continue
                if not isinstance(e, (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError)):
                    log.exception("%s watch (%s) failed", self.kind[1], self.namespace or "all namespaces")
                problem = str(e)
            failures += 1
            delay = min(self.max_backoff_seconds, 0.5 * 2**failures) * random.uniform(0.8, 1.2)
            where = self.namespace or "all namespaces"
            log.warning("%s watch (%s): %s; again in %.1fs", self.kind[1], where, problem, delay)
            self._stop.wait(delay)

    def _list(self, relist: bool) -> str | None:
        listing = self.kube.list_owned(self.kind, self.namespace)
        self.sink.listed(listing, relist)
        self.synced.set()
        return listing.resource_version

    def _follow(self) -> int:
        """Apply the watch's events from the version last seen, kept per event (a stream cut midway resumes after
        its last event, not from where it began); returns how many came, bookmarks included."""
        query = {"labelSelector": selectors.CHILD_SELECTOR}
        if self._version is not None:
            query["resourceVersion"] = self._version
        path = path_of(*self.kind, self.namespace)
        # Spread, as client-go's are: every reflector of the process would otherwise reconnect at the same moment.
        timeout = int(self.timeout_seconds * random.uniform(1.0, 2.0))
        count = 0
        for type, obj in self.kube.watch(path, query, timeout):
            count += 1
            if type == "ERROR":
                raise KubeError(int(obj.get("code") or 500), obj.get("reason", ""), obj.get("message", ""), "GET")
            if type != "BOOKMARK":
                self.sink.event(type, obj)
            # After the sink took it: an event it failed on comes again when the watch resumes.
            self._version = (obj.get("metadata") or {}).get("resourceVersion") or self._version
        return count
