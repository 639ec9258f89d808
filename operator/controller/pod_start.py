"""Pods that do not start: a container the kubelet cannot start (bad image, missing Secret...) is reported at once
as `ContainersWaiting` with the kubelet's own reason; a pod still Pending after scheduling.startupTimeoutSeconds as
`Unschedulable`, naming what it waits for. Pure, like `status`."""

from __future__ import annotations

from datetime import datetime, timedelta

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import ConditionType, Reason, get_condition, set_condition
from zerotrain.operator.controller.observe import ObservedPod, PodPhase
from zerotrain.spec import ZeroTrainingJobSpec


def _why(pod: ObservedPod) -> str:
    if pod.waiting:
        return f"{pod.waiting}: {pod.waiting_message}"
    return pod.message or pod.unschedulable or "not scheduled"


def _waiting(st: ZeroTrainingJobStatus, current: list[ObservedPod], now: datetime) -> None:
    stuck = [p for p in current if p.waiting]
    if stuck:
        first = stuck[0]
        msg = f"{len(stuck)} pod(s) cannot start, e.g. {first.name}: {first.waiting_message}"
        set_condition(st, ConditionType.CONTAINERS_WAITING, True, first.waiting, msg, now)
    elif get_condition(st, ConditionType.CONTAINERS_WAITING) is not None:
        msg = "every container started or is starting"
        set_condition(st, ConditionType.CONTAINERS_WAITING, False, Reason.CONTAINERS_STARTED, msg, now)


def _queued(st: ZeroTrainingJobStatus, current: list[ObservedPod], now: datetime) -> None:
    held = [p for p in current if p.gated]
    if held:
        msg = f"{len(held)} pod(s) held by Kueue until the gang is admitted against its queue's quota"
        set_condition(st, ConditionType.QUEUED, True, Reason.WAITING_FOR_ADMISSION, msg, now)
    elif get_condition(st, ConditionType.QUEUED) is not None and current:
        set_condition(st, ConditionType.QUEUED, False, Reason.ADMITTED, "Kueue admitted the gang", now)


def report(
    spec: ZeroTrainingJobSpec, st: ZeroTrainingJobStatus, current: list[ObservedPod], now: datetime, also: str = ""
) -> float | None:
    """Set ContainersWaiting and Unschedulable (ending with `also`, e.g. why an elastic gang cannot shrink) on `st`;
    the seconds until a Pending pod's startup timeout is due."""
    _waiting(st, current, now)
    _queued(st, current, now)
    limit = timedelta(seconds=spec.scheduling.startup_timeout_seconds)
    # A pod Kueue holds waits for quota, which is what a queue is for: not a startup problem.
    late = [p for p in current if p.phase == PodPhase.PENDING and not p.gated and p.created and now - p.created > limit]
    if late:
        msg = (
            f"{len(late)} pod(s) Pending longer than startupTimeoutSeconds="
            f"{spec.scheduling.startup_timeout_seconds}, e.g. {late[0].name}: {_why(late[0])}"
        ) + (f"; {also}" if also else "")
        set_condition(st, ConditionType.UNSCHEDULABLE, True, Reason.STARTUP_TIMEOUT, msg, now)
    elif get_condition(st, ConditionType.UNSCHEDULABLE) is not None:
        set_condition(st, ConditionType.UNSCHEDULABLE, False, Reason.PODS_SCHEDULED, "no pod is stuck Pending", now)
    pending = [p.created for p in current if p.phase == PodPhase.PENDING and not p.gated and p.created]
    if pending and not late:
        return max(0.5, (min(pending) + limit - now).total_seconds())
    return None
