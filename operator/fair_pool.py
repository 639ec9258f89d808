"""Pod creates of every job through one set of workers, taken round-robin between jobs.

A pool per pass would let a gang of thousands hold as many connections as it likes while a two-pod job created at
the same moment waits behind it. Here every job with work queued gets the next free worker in turn, so the small
job's pods go out within a round whatever the big one still has to do, and the total in flight stays at `workers`
(the operator's POD_CREATE_CONCURRENCY).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class FairPool:
    """`workers` daemon threads serving each key's queue in turn; `map` blocks its caller until its items are done."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._queues: dict[Hashable, collections.deque[Callable[[], None]]] = {}
        self._turns: collections.deque[Hashable] = collections.deque()
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def map(self, key: Hashable, fn: Callable[[T], R], items: Sequence[T]) -> list[concurrent.futures.Future[R]]:
        """Run `fn` on every item, the key's items in order among the others' turns; returns once all are done."""
        futures: list[concurrent.futures.Future[R]] = []
        with self._cv:
            if self._closed:
                raise RuntimeError("the pod-create pool is closed")
            self._start()
            queue = self._queues.setdefault(key, collections.deque())
            if not queue and key not in self._turns:
                self._turns.append(key)
            for item in items:
                future: concurrent.futures.Future[R] = concurrent.futures.Future()
                queue.append(_task(fn, item, future))
                futures.append(future)
            self._cv.notify_all()
        concurrent.futures.wait(futures)
        return futures

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def _start(self) -> None:
        while len(self._threads) < self.workers:
            t = threading.Thread(target=self._serve, name=f"zerotrain-create-{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)

    def _next(self) -> Callable[[], None] | None:
        """The first task of the key whose turn it is (the key goes to the back if it has more); None once closed."""
        with self._cv:
            while not self._turns and not self._closed:
                self._cv.wait()
            if not self._turns:
                return None
            key = self._turns.popleft()
            queue = self._queues[key]
            task = queue.popleft()
            if queue:
                self._turns.append(key)
            else:
                del self._queues[key]
            return task

    def _serve(self) -> None:
        while (task := self._next()) is not None:
            task()


def _task(fn: Callable[[T], R], item: T, future: concurrent.futures.Future[R]) -> Callable[[], None]:
    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(item))
        except BaseException as e:  # handed to the caller, which raises the first in item order
            future.set_exception(e)

    return run
