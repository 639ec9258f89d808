"""The Kubernetes Events a status change posts about its job: pure, from the status before and after a pass."""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import ConditionType

_WARNING_WHEN_TRUE = {
    ConditionType.FAILED,
    ConditionType.RESTARTING,
    ConditionType.INVALID_SPEC,
    ConditionType.UNSCHEDULABLE,
    ConditionType.CHILD_WRITE_FAILED,
    ConditionType.CONTAINERS_WAITING,
    ConditionType.QUEUE_UNAVAILABLE,
    ConditionType.STRAGGLER,
}


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes Event to post about the job."""

    type: str  # Normal | Warning
    reason: str
    message: str


def transitions(previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus) -> list[JobEvent]:
    """One Event per condition whose status or reason changed (conditions changed for the same reason and
    message, e.g. InvalidSpec and Failed, share one), and one per phase change otherwise."""
    before = {c.type: (c.status, c.reason) for c in (previous.conditions if previous else [])}
    events: list[JobEvent] = []
    for c in new.conditions:
        if before.get(c.type) == (c.status, c.reason) or (c.type not in before and c.status == "False"):
            continue
        warn = c.status == "True" and ConditionType(c.type) in _WARNING_WHEN_TRUE
        event = JobEvent("Warning" if warn else "Normal", c.reason, c.message or f"{c.type}={c.status}")
        same = next((e for e in events if (e.reason, e.message) == (event.reason, event.message)), None)
        if same is None:
            events.append(event)
        elif event.type == "Warning" and same.type == "Normal":
            events[events.index(same)] = event
    if not events and (previous is None or previous.phase != new.phase):
        events.append(JobEvent("Normal", f"Phase{new.phase.value}", f"job is {new.phase.value}"))
    return events
