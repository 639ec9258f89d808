"""The operator's pods, listed once and then followed by a watch from the LIST's resourceVersion, into the cache.

client-go's reflector, for one kind: LIST, WATCH from the list's resourceVersion (bookmarks keep it current),
resume from the last version seen when the server ends the stream, LIST again on 410 Gone, back off on errors. Each
event replaces or removes the pod in the cache and asks for a pass of its job.

It is not kopf's pod watch because a gang start is thousands of pod events in a few seconds, and kopf spends about
half a millisecond of the process's one interpreter on each (its causes, progress storage, a handler task per
object): as much again as the create that caused the event, so the operator created pods at half a plain client's
pace. Here an event costs a JSON decode and a dict store.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import urllib3

from zerotrain.operator import naming
from zerotrain.operator.cache import Key, ObjectCache, job_of
from zerotrain.operator.kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)
GONE = 410


class PodWatch:
    """One thread following the operator's pods in `namespace` (every namespace: None) into `cache`; `changed`
    is told the job of every pod event (it must not block: the next event waits for it)."""

    def __init__(
        self,
        kube: Kube,
        cache: ObjectCache,
        namespace: str | None,
        changed: Callable[[Key], None],
        timeout_seconds: int = 300,
        max_backoff_seconds: float = 30.0,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.namespace = namespace
        self.changed = changed
        self.timeout_seconds = timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.synced = threading.Event()
        """Set once the first LIST is in the cache (the namespace's pod sets are complete from then on)."""
        self._stop = threading.Event()
        where = namespace or "all-namespaces"
        self._thread = threading.Thread(target=self._run, name=f"zerotrain-pod-watch-{where}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for _ in range(50):  # a watch that was just starting is cut on the next round
            self.kube.stop_watches()
            self._thread.join(timeout=0.2)
            if not self._thread.is_alive():
                return

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(relist=self.synced.is_set())
                version = self._follow(version)
                failures = 0
            except (KubeError, urllib3.exceptions.HTTPError, ValueError) as e:
                if self._stop.is_set():
                    return
                if isinstance(e, KubeError) and e.status == GONE:
                    version = None  # compacted away: list again, as client-go does
                    continue
                failures += 1
                delay = min(self.max_backoff_seconds, 0.5 * 2**failures) * random.uniform(0.8, 1.2)
                log.warning("pod watch (%s): %s; again in %.1fs", self.namespace or "all namespaces", e, delay)
                self._stop.wait(delay)

    def _list(self, relist: bool) -> str | None:
        listing = self.kube.list_operator_pods(self.namespace)
        jobs = self.cache.pods_listed(self.namespace, listing)
        self.synced.set()
        if relist:  # the watch missed events: every job it covers takes a look (the first time kopf's resume does)
            for job in jobs:
                self.changed(job)
        return listing.resource_version

    def _follow(self, version: str | None) -> str | None:
        """Apply the watch's events from `version`; the last version seen when the server ends the stream."""
        query = {"labelSelector": naming.CHILD_SELECTOR}
        if version is not None:
            query["resourceVersion"] = version
        path = path_of("v1", "pods", self.namespace)
        for kind, pod in self.kube.watch(path, query, self.timeout_seconds):
            if kind == "ERROR":
                raise KubeError(int(pod.get("code") or 500), pod.get("reason", ""), pod.get("message", ""), "GET")
            version = (pod.get("metadata") or {}).get("resourceVersion") or version
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.cache.drop_pod(pod)
            else:
                self.cache.put_pod(pod, handed_over=True)
            if (job := job_of(pod)) is not None:
                self.changed(job)
        return version
