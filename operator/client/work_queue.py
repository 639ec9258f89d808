"""The one way into a pass: client-go's rate-limited, delaying work queue, for job keys.

Every watch event of every kind, every wake-up a pass asked for and every resync only add a key here; a fixed set
of workers takes keys out (`Reconciler`). The queue gives the guarantees the passes rely on:

- deduplicated: a key added while it waits is queued once;
- one pass per key at a time: a key added while a worker holds it is queued again when that worker is `done`, at
  the back, so a job whose pod events keep coming gets one pass per turn and the others' passes go between;
- delayed adds (`add_after`), the earliest asked for winning, all served by one timer thread;
- one back-off per key (`add_rate_limited` counts consecutive failures, `forget` resets them).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys to work on, each handed to one worker at a time; `get` blocks until one is ready or the queue shuts down."""

    def __init__(self, backoff: Callable[[int], float]) -> None:
        self._backoff = backoff
        """Seconds before the retry of a key that failed `n` times in a row."""
        self._ready: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        """Keys wanted: those in `_ready`, and those a worker holds that must run once more."""
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._due: dict[K, float] = {}
        """The earliest time each delayed key is wanted."""
        self._delayed: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._timer: threading.Thread | None = None

    def add(self, key: K) -> None:
        with self._cv:
            self._add(key)

    def _add(self, key: K) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.append(key)
            self._cv.notify_all()

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` in `delay` seconds (now if not positive); an earlier wake-up already asked for stands."""
        if delay <= 0:
            self.add(key)
            return
        with self._cv:
            if self._closed:
                return
            when = time.monotonic() + delay
            if key in self._due and self._due[key] <= when:
                return
            self._due[key] = when
            heapq.heappush(self._delayed, (when, next(self._seq), key))
            if self._timer is None:
                self._timer = threading.Thread(target=self._release, name="zerotrain-queue-timer", daemon=True)
                self._timer.start()
            self._cv.notify_all()

    def add_rate_limited(self, key: K) -> float:
        """One more consecutive failure of `key`: add it after its back-off, which is returned."""
        with self._cv:
            n = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self._backoff(n)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """`key` succeeded: its next failure backs off from the start."""
        with self._cv:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cv:
            return self._failures.get(key, 0)

    def get(self) -> K | None:
        """The next key, now held by the caller until `done`; None once the queue shuts down."""
        with self._cv:
            while not self._ready and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            key = self._ready.popleft()
            self._dirty.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: K) -> None:
        """The worker is through with `key`: queued again, at the back, if it was added meanwhile."""
        with self._cv:
            self._processing.discard(key)
            if key in self._dirty and not self._closed:
                self._ready.append(key)
                self._cv.notify_all()

    def __len__(self) -> int:
        """Keys ready for a worker (the delayed ones not counted)."""
        with self._cv:
            return len(self._ready)

    def delayed(self) -> int:
        with self._cv:
            return len(self._due)

    def shut_down(self) -> None:
        """No key is handed out from now on; `get` returns None to every worker."""
        with self._cv:
            self._closed = True
            self._ready.clear()
            self._dirty.clear()
            self._delayed.clear()
            self._due.clear()
            self._cv.notify_all()
        if self._timer is not None:
            self._timer.join(timeout=5)

    def _release(self) -> None:
        """The timer thread: moves each delayed key into the queue when it is due."""
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    when, _, key = heapq.heappop(self._delayed)
                    if self._due.get(key) == when:  # not an entry an earlier wake-up replaced
                        del self._due[key]
                        self._add(key)
                timeout = self._delayed[0][0] - now if self._delayed else None
                self._cv.wait(timeout)
