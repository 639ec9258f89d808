"""The operator's Events as client-go's recorder sends them: repeats counted on one Event, similar ones combined,
a flapping job's flood cut by the spam filter."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from zerotrain.operator.children.builders import JobRef, build_event
from zerotrain.operator.client.events import COMBINED, SIMILAR_MAX, SPAM_BURST, EventRecorder

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
