"""The operator's Events as client-go's recorder sends them: repeats counted on one Event, similar ones combined,
a flapping job's flood cut by the spam filter."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

from zerotrain.operator.children.builders import JobRef, build_event
from zerotrain.operator.client.events import COMBINED, SIMILAR_MAX, SPAM_BURST, EventQueue, EventRecorder

Obj = dict[str, Any]
JOB = JobRef(namespace="a", name="flappy", uid="u-1")
OTHER = JobRef(namespace="a", name="calm", uid="u-2")


class Sink:
    def __init__(self) -> None:
        self.created: list[Obj] = []
        self.patched: list[tuple[str, Obj]] = []
        self.gone: set[str] = set()

    def create_event(self, event: Obj) -> Obj | None:
        self.created.append(event)
        return event

    def patch_event(self, namespace: str, name: str, patch: Obj) -> bool:
        if name in self.gone:
            return False
        self.patched.append((name, patch))
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def event(message: str, reason: str = "GangRestarting", job: JobRef = JOB) -> Obj:
    return build_event(job, "Warning", reason, message, datetime(2026, 12, 2, tzinfo=timezone.utc))


def test_a_repeat_within_ten_minutes_is_a_count_on_the_first() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock)
    for _ in range(3):
        rec.record(event("rank 1 failed"))
    assert len(sink.created) == 1
    first = sink.created[0]["metadata"]["name"]
    assert [(n, p["count"]) for n, p in sink.patched] == [(first, 2), (first, 3)]
    clock.now += 601  # past the window: a new Event
    rec.record(event("rank 1 failed"))
    assert len(sink.created) == 2
    sink.gone.add(sink.created[1]["metadata"]["name"])  # expired on the server (events live an hour)
    rec.record(event("rank 1 failed"))
    assert len(sink.created) == 3


def test_similar_events_are_combined_into_one() -> None:
    sink = Sink()
    rec = EventRecorder(sink, Clock())
    for i in range(SIMILAR_MAX + 3):
        rec.record(event(f"rank {i} failed"))
    messages = [e["message"] for e in sink.created]
    assert len(messages) == SIMILAR_MAX  # the 10th is the combined one; the later ones count on it
    assert messages[-1] == f"{COMBINED}rank {SIMILAR_MAX - 1} failed"
    combined = sink.created[-1]["metadata"]["name"]
    assert [(n, p["count"], p["message"]) for n, p in sink.patched] == [
        (combined, c, f"{COMBINED}rank {i} failed")
        for c, i in zip([2, 3, 4], range(SIMILAR_MAX, SIMILAR_MAX + 3), strict=True)
    ]


def test_the_spam_filter_cuts_a_flapping_job_but_not_its_neighbours() -> None:
    sink, clock = Sink(), Clock()
    rec = EventRecorder(sink, clock)
    reasons = [f"Reason{i}" for i in range(SPAM_BURST + 5)]  # all different: nothing dedups or combines
    for r in reasons:
        rec.record(event("x", reason=r))
    assert len(sink.created) == SPAM_BURST and rec.dropped == 5
    rec.record(event("x", reason="Calm", job=OTHER))  # another job has its own bucket
    assert sink.created[-1]["involvedObject"]["name"] == "calm"
    clock.now += 300  # one token back every 5 minutes
    rec.record(event("x", reason="Later"))
    rec.record(event("x", reason="TooSoon"))
    assert [e["reason"] for e in sink.created[-1:]] == ["Later"] and rec.dropped == 6


class SlowSink(Sink):
    """A sink whose first post waits until the test lets it go: a pass must not wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def create_event(self, event: Obj) -> Obj | None:
        self.gate.wait(10)
        return super().create_event(event)


def test_a_queued_event_is_sent_by_the_sender_while_the_pass_goes_on() -> None:
    sink = SlowSink()
    events = EventQueue(EventRecorder(sink, Clock()))
    events.record(event("rank 1 failed"))  # returns at once, though the post hangs
    events.record(event("rank 1 failed"))
    assert sink.created == [] and not events.flush(0.05)
    sink.gate.set()
    assert events.flush(5)
    assert [e["message"] for e in sink.created] == ["rank 1 failed"] and len(sink.patched) == 1  # correlated still
    events.close()


def test_a_full_queue_drops_events_and_counts_them() -> None:
    sink = SlowSink()
    events = EventQueue(EventRecorder(sink, Clock()), capacity=2)
    for i in range(5):
        events.record(event(f"rank {i} failed", job=JobRef(namespace="a", name=f"j{i}", uid=f"u{i}")))
    # The sender holds one while its post hangs and two wait: the rest are dropped.
    assert events.dropped >= 2
    sink.gate.set()
    events.close()
    assert len(sink.created) + events.dropped == 5


class FailingSink(Sink):
    def create_event(self, event: Obj) -> Obj | None:
        if "boom" in event["message"]:
            raise RuntimeError("server said no")
        return super().create_event(event)


def test_one_event_that_fails_does_not_stop_the_ones_after_it() -> None:
    sink = FailingSink()
    events = EventQueue(EventRecorder(sink, Clock()))
    events.record(event("boom"))
    events.record(event("rank 2 failed"))
    assert events.flush(5)
    assert [e["message"] for e in sink.created] == ["rank 2 failed"]
    events.close()


def test_close_waits_no_longer_than_told_and_what_is_left_is_dropped() -> None:
    sink = SlowSink()  # its first post hangs until the gate opens
    events = EventQueue(EventRecorder(sink, Clock()))
    for i in range(3):
        events.record(event(f"rank {i} failed", job=JobRef(namespace="a", name=f"j{i}", uid=f"u{i}")))
    started = time.monotonic()
    events.close(0.3)
    assert time.monotonic() - started < 2
    events.record(event("after close"))
    sink.gate.set()
    time.sleep(0.3)
    # The post in flight may still land; the two queued behind it and the one after close do not.
    assert len(sink.created) <= 1 and events.dropped == 3


def test_an_idle_queue_closes_at_once_and_its_sender_ends() -> None:
    # The sender sleeps on the queue's condition until an Event or the close arrives: nothing wakes it meanwhile,
    # and the close both wakes and ends it.
    before = {t for t in threading.enumerate() if t.name == "zerotrain-events"}
    sink = Sink()
    events = EventQueue(EventRecorder(sink, Clock()))
    (sender,) = {t for t in threading.enumerate() if t.name == "zerotrain-events"} - before
    events.record(event("rank 0 failed"))
    assert events.flush(5) and len(sink.created) == 1
    started = time.monotonic()
    events.close(5)
    assert time.monotonic() - started < 1 and not sender.is_alive()
    assert events.dropped == 0
