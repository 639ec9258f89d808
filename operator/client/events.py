"""The operator's Events, sent as client-go's event recorder sends them (tools/record's EventCorrelator).

A job that flaps (fails, backs off, restarts, fails again) would otherwise post a new Event at every turn, each
one an object etcd keeps for an hour. So, per job:

- **spam filter**: a token bucket of 25 Events, refilled one per 5 minutes; an Event beyond it is dropped;
- **aggregation**: from the 10th Event of one type and reason with a different message within 10 minutes, the
  message becomes "(combined from similar events): ..." and they all count on one Event;
- **deduplication**: an Event equal to one sent within 10 minutes is not posted again: the existing one gets its
  `count` raised and its `lastTimestamp` moved (one PATCH), which `kubectl describe` shows as "(x4 over 3m)".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from zerotrain.operator.client.rate_limit import TokenBucket
from zerotrain.operator.objects import Obj

log = logging.getLogger(__name__)

WINDOW_SECONDS = 600.0
"""How long an Event is remembered for deduplication and aggregation (client-go: 10 minutes)."""
SIMILAR_MAX = 10
"""Distinct messages of one type and reason within the window before they are combined (client-go's default)."""
SPAM_BURST = 25
SPAM_QPS = 1 / 300
MAX_REMEMBERED = 4096
"""Events remembered at most (client-go's LRU size); the oldest are forgotten first."""
COMBINED = "(combined from similar events): "


class EventSink(Protocol):
    """Where Events go: kube.Kube."""

    def create_event(self, event: Obj) -> Obj | None: ...

    def patch_event(self, namespace: str, name: str, patch: Obj) -> bool: ...


@dataclass
class _Sent:
    name: str
    namespace: str
    count: int
    at: float


def _object_key(event: Obj) -> tuple[str, ...]:
    o = event.get("involvedObject") or {}
    return (o.get("namespace", ""), o.get("kind", ""), o.get("name", ""), o.get("uid", ""))


@dataclass
class EventRecorder:
    """Correlates, then sends, every Event the operator posts. Thread-safe."""

    sink: EventSink
    clock: Callable[[], float] = time.monotonic
    _buckets: OrderedDict[tuple[str, ...], TokenBucket] = field(default_factory=OrderedDict)
    _similar: OrderedDict[tuple[str, ...], dict[str, float]] = field(default_factory=OrderedDict)
    _sent: OrderedDict[tuple[str, ...], _Sent] = field(default_factory=OrderedDict)
    _mu: threading.Lock = field(default_factory=threading.Lock)
    dropped: int = 0
    """Events dropped: by the spam filter (or, sent through an `EventQueue`, by the queue)."""

    def count_dropped(self) -> None:
        with self._mu:
            self.dropped += 1

    def record(self, event: Obj) -> None:
        """Send `event` (builders.build_event) as a new Event, as a count on an earlier one, or not at all."""
        now = self.clock()
        obj = _object_key(event)
        with self._mu:
            bucket = self._buckets.setdefault(obj, TokenBucket(SPAM_QPS, SPAM_BURST, clock=self.clock))
            self._buckets.move_to_end(obj)
            while len(self._buckets) > MAX_REMEMBERED:  # one per job ever seen would grow without end
                self._buckets.popitem(last=False)
            if not bucket.try_take():
                self.dropped += 1
                log.debug("event %s on %s dropped by the spam filter", event.get("reason"), obj)
                return
            event, key = self._aggregate(obj, event, now)
            earlier = self._sent.get(key)
            if earlier is not None and now - earlier.at > WINDOW_SECONDS:
                earlier = None
        if earlier is not None:
            count = earlier.count + 1
            patch = {"count": count, "lastTimestamp": event.get("lastTimestamp"), "message": event["message"]}
            if self.sink.patch_event(earlier.namespace, earlier.name, patch):
                self._remember(key, _Sent(earlier.name, earlier.namespace, count, now))
                return
        created = self.sink.create_event(event)
        if created is not None:
            md = created.get("metadata") or event["metadata"]
            self._remember(key, _Sent(md["name"], md.get("namespace", ""), int(created.get("count") or 1), now))

    def _aggregate(self, obj: tuple[str, ...], event: Obj, now: float) -> tuple[Obj, tuple[str, ...]]:
        """The Event to send and its deduplication key: from the SIMILAR_MAX-th distinct message of one type and
        reason in the window, one combined Event for all of them (its message the latest one's)."""
        similar = (*obj, event.get("type", ""), event.get("reason", ""))
        messages = self._similar.setdefault(similar, {})
        self._similar.move_to_end(similar)
        for message in [m for m, at in messages.items() if now - at > WINDOW_SECONDS]:
            del messages[message]
        messages[event.get("message", "")] = now
        while len(self._similar) > MAX_REMEMBERED:
            self._similar.popitem(last=False)
        if len(messages) < SIMILAR_MAX:
            return event, (*similar, event.get("message", ""))
        return {**event, "message": (COMBINED + event.get("message", ""))[:1024]}, (*similar, COMBINED)

    def _remember(self, key: tuple[str, ...], sent: _Sent) -> None:
        with self._mu:
            self._sent[key] = sent
            self._sent.move_to_end(key)
            while len(self._sent) > MAX_REMEMBERED:
                self._sent.popitem(last=False)


MAX_QUEUED = 1000
"""Events waiting to be sent at most (client-go's maxQueuedEvents); one beyond it is dropped and counted."""


class EventQueue:
    """Events sent off the pass, as client-go's broadcaster sends them: `record` only queues, one sender thread
    correlates and posts. An Event is a report, not a step of the reconcile: posted inside the pass, it added a round
    trip to every pass that changed a job's phase (on a real server under a 100-job burst, the slowest passes')."""

    def __init__(self, recorder: EventRecorder, capacity: int = MAX_QUEUED) -> None:
        self.recorder = recorder
        self.capacity = capacity
        self._events: deque[Obj] = deque()
        self._unsent = 0
        """Events queued or being posted: what `flush` waits for."""
        self._stopped = False
        # One condition for every state change, so the sender sleeps until there is work or a stop (no polling).
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._send, name="zerotrain-events", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Events dropped: by the spam filter, because the queue was full, or still queued at `close`."""
        return self.recorder.dropped

    def record(self, event: Obj) -> None:
        """Queue `event` for the sender; never waits (a full queue drops it, as client-go's does)."""
        with self._cv:
            taken = not self._stopped and len(self._events) < self.capacity
            if taken:
                self._events.append(event)
                self._unsent += 1
                self._cv.notify_all()
            full = not self._stopped and not taken
        if not taken:
            self.recorder.count_dropped()
        if full:
            log.warning("event %s dropped: %d events wait to be sent already", event.get("reason"), self.capacity)

    def flush(self, wait_seconds: float = 10.0) -> bool:
        """Wait until every Event queued so far is sent (or refused); whether that happened in time."""
        deadline = time.monotonic() + wait_seconds
        with self._cv:
            while self._unsent:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, wait_seconds: float = 5.0) -> None:
        """Send what is queued for up to `wait_seconds` in all, then stop: what is left is dropped (and counted), so
        nothing is posted after this returns but the one Event in flight, if any."""
        deadline = time.monotonic() + wait_seconds
        self.flush(wait_seconds)
        with self._cv:
            self._stopped = True
            left = len(self._events)
            self._events.clear()
            self._unsent -= left
            self._cv.notify_all()
        for _ in range(left):
            self.recorder.count_dropped()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _send(self) -> None:
        while True:
            with self._cv:
                while not self._events and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                event = self._events.popleft()
            try:
                self.recorder.record(event)
            except Exception:  # a report that could not be sent must not stop the ones after it
                log.exception("sending event %s failed", event.get("reason"))
            finally:
                with self._cv:
                    self._unsent -= 1
                    self._cv.notify_all()
