"""Pod creates of every job through one set of workers, taken round-robin between jobs.

A pool per pass would let a gang of thousands hold as many connections as it likes while a two-pod job created at
the same moment waits behind it. Here every job with work queued gets the next free worker in turn, so the small
job's pods go out within a round whatever the big one still has to do, and the total in flight stays at `workers`
(the operator's POD_CREATE_CONCURRENCY).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class FairPool:
    """`workers` daemon threads serving each key's queue in turn; `map` blocks its caller until its items are done."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._queues: dict[Hashable, collections.deque[_Task]] = {}
        self._turns: collections.deque[Hashable] = collections.deque()
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def map(self, key: Hashable, fn: Callable[[T], R], items: Sequence[T]) -> list[concurrent.futures.Future[R]]:
        """Run `fn` on every item, the key's items in order among the others' turns; returns once all are done."""
        futures: list[concurrent.futures.Future[R]] = []
        if not items:  # a key in the turns with nothing queued would have a worker pop an empty queue
            return futures
        with self._cv:
            if self._closed:
                raise RuntimeError("the pod-create pool is closed")
            self._start()
            queue = self._queues.setdefault(key, collections.deque())
            if not queue and key not in self._turns:
                self._turns.append(key)
            for item in items:
                future: concurrent.futures.Future[R] = concurrent.futures.Future()
                queue.append(_Task(functools.partial(fn, item), future))
                futures.append(future)
            self._cv.notify_all()
        concurrent.futures.wait(futures)
        return futures

    def close(self) -> None:
        """Stop the workers; what is still queued fails with RuntimeError for its caller (the tasks in flight
        finish)."""
        with self._cv:
            self._closed = True
            queued = [task for queue in self._queues.values() for task in queue]
            self._queues.clear()
            self._turns.clear()
            self._cv.notify_all()
        for task in queued:
            task.cancel()
        deadline = time.monotonic() + 5
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:
        while len(self._threads) < self.workers:
            t = threading.Thread(target=self._serve, name=f"zerotrain-create-{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)

    def _next(self) -> _Task | None:
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
            task.run()


class _Task:
    """One queued call and the future its caller waits on."""

    def __init__(self, call: Callable[[], object], future: concurrent.futures.Future[Any]) -> None:
        self.call, self.future = call, future

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.call())
        except BaseException as e:  # handed to the caller, which raises the first in item order
            self.future.set_exception(e)

    def cancel(self) -> None:
        if self.future.set_running_or_notify_cancel():
            self.future.set_exception(RuntimeError("the pod-create pool closed before this create ran"))
