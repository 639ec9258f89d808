"""The periodic pass over every known job, outside kopf.

kopf's timers need a finalizer on every job (so it can stop them on deletion), and a finalizer makes a job
undeletable while the operator is down: `kubectl delete ztj`, `kubectl delete ns` and a CRD removal would hang.
So one thread adds every job the cache holds to the work queue every `resync_seconds` (the workers run the passes;
a job already queued is not queued twice). Jobs need no finalizer: their children go with them through owner
references.

The cache is the one list of jobs. Every `relist_seconds` the round starts with one LIST of jobs per namespace
(`lister`): kopf re-lists jobs after 410 Gone but sends no DELETED for those that went away in between. The
children need no such LIST: their reflectors re-list on 410 themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from zerotrain.operator.objects import Key

log = logging.getLogger(__name__)
Lister = Callable[[], None]
"""LISTs every job into the cache (dropping those gone unseen)."""


class Resync:
    """Every job of `known()` asked for (`enqueue`) every `interval` seconds from one daemon thread."""

    def __init__(
        self,
        interval: float,
        enqueue: Callable[[Key], None],
        known: Callable[[], list[Key]],
        lister: Lister | None = None,
        relist_seconds: float = 300.0,
    ) -> None:
        self.interval = interval
        self.relist_seconds = relist_seconds
        self._enqueue = enqueue
        self._known = known
        self._lister = lister
        self._listed_at = time.monotonic()  # kopf has just listed the jobs: the first LIST is one period away
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="zerotrain-resync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_once(self) -> None:
        """Ask for a pass of every job (the work queue's workers run them)."""
        self._backstop()
        for key in self._known():
            if self._stop.is_set():
                return
            self._enqueue(key)

    def _backstop(self) -> None:
        """Every `relist_seconds`: the jobs a stalled or restarting watch has not shown, or not shown gone."""
        now = time.monotonic()
        if self._lister is None or now - self._listed_at < self.relist_seconds:
            return
        try:
            self._lister()
        except Exception as e:
            log.warning("resync: listing jobs failed: %s", e)
            return
        self._listed_at = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()
