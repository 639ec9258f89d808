"""The periodic pass over every known job, outside kopf.

kopf's timers need a finalizer on every job (so it can stop them on deletion), and a finalizer makes a job
undeletable while the operator is down: `kubectl delete ztj`, `kubectl delete ns` and a CRD removal would hang.
So the operator keeps its own set of the jobs the watch has shown it, and one thread adds each of them to the
work queue every `resync_seconds` (the workers run the passes; a job already queued is not queued twice). Jobs need
no finalizer: their children go with them through owner references.

A pass over a steady job reads only the operator's cache (client.cache). Every `relist_seconds` the round starts
with one LIST of jobs and one of pods per namespace, which adds jobs a stalled watch has not shown and drops those
gone without a DELETED event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from zerotrain.operator.objects import Key

log = logging.getLogger(__name__)
Lister = Callable[[], tuple[list[Key], list[Key]]]
"""LISTs every job (and fills the cache): the jobs present, and those gone without a DELETED event."""


class Resync:
    """The jobs the watch has shown, each asked for (`enqueue`) every `interval` seconds from one daemon thread."""

    def __init__(
        self,
        interval: float,
        enqueue: Callable[[Key], None],
        lister: Lister | None = None,
        relist_seconds: float = 300.0,
    ) -> None:
        self.interval = interval
        self.relist_seconds = relist_seconds
        self._enqueue = enqueue
        self._lister = lister
        self._listed_at: float | None = None
        self._jobs: set[Key] = set()
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def seen(self, key: Key, present: bool) -> None:
        """A watch event: the job exists (ADDED, MODIFIED) or is gone (DELETED)."""
        with self._mu:
            if present:
                self._jobs.add(key)
            else:
                self._jobs.discard(key)

    def jobs(self) -> list[Key]:
        with self._mu:
            return sorted(self._jobs)

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
        for key in self.jobs():
            if self._stop.is_set():
                return
            self._enqueue(key)

    def _backstop(self) -> None:
        """Every `relist_seconds`: the jobs a stalled or restarting watch has not shown, or not shown gone."""
        now = time.monotonic()
        if self._lister is None or (self._listed_at is not None and now - self._listed_at < self.relist_seconds):
            return
        try:
            present, gone = self._lister()
        except Exception as e:
            log.warning("resync: listing jobs failed: %s", e)
            return
        self._listed_at = now
        with self._mu:
            self._jobs.update(present)
            self._jobs.difference_update(gone)

    def _run(self) -> None:
        # The first LIST at once: passes at start-up (kopf resumes every job) then read each job's pods from the
        # cache instead of listing them job by job.
        self._backstop()
        while not self._stop.wait(self.interval):
            self.run_once()
