"""Condition Straggler: the ranks rank 0 reported in `status.stragglers` (the runtime's verdict at the end of a
window of steps, `runtime/job/stragglers.py`), named with their pod and node, which only the operator knows. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from zerotrain.job_status import Phase, StragglerCause, StragglerStatus, ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import ConditionType, Reason, get_condition, set_condition
from zerotrain.operator.controller.observe import ObservedPod

_REASON = {StragglerCause.INPUT: Reason.SLOW_INPUT, StragglerCause.COMPUTE: Reason.SLOW_COMPUTE}
_WHAT = {StragglerCause.INPUT: "data wait", StragglerCause.COMPUTE: "compute"}


def where(s: StragglerStatus, pods: Sequence[ObservedPod], nproc_per_node: int) -> str:
    """`rank R (pod P on node N)`, from the current gang's pods (a rank's pod is its replica)."""
    pod = next((p for p in pods if p.replica == s.rank // nproc_per_node), None)
    if pod is None:
        return f"rank {s.rank}"
    return f"rank {s.rank} (pod {pod.name} on node {pod.node})" if pod.node else f"rank {s.rank} (pod {pod.name})"


def describe(s: StragglerStatus, pods: Sequence[ObservedPod], nproc_per_node: int) -> str:
    times = f", {s.seconds_per_step / s.others_seconds_per_step:.2f}×" if s.others_seconds_per_step > 0 else ""
    return (
        f"{where(s, pods, nproc_per_node)} holds the gang back ({s.cause.value}): {_WHAT[s.cause]} "
        f"{s.seconds_per_step:.3f} s/step against the other ranks' median {s.others_seconds_per_step:.3f}{times}, "
        f"over the {s.window_steps} steps to step {s.step}"
    )


def set_straggler(st: ZeroTrainingJobStatus, pods: Sequence[ObservedPod], nproc_per_node: int, now: datetime) -> None:
    """True while a running gang has stragglers (the first one's cause as the reason, every one in the message);
    False once it keeps pace again or stops running. A job that never straggled gets no condition."""
    named = st.stragglers if st.phase == Phase.RUNNING else []
    if named:
        message = "; ".join(describe(s, pods, nproc_per_node) for s in named)
        set_condition(st, ConditionType.STRAGGLER, True, _REASON[named[0].cause], message, now)
    elif get_condition(st, ConditionType.STRAGGLER) is not None:
        set_condition(st, ConditionType.STRAGGLER, False, Reason.GANG_KEEPS_PACE, "every rank keeps pace", now)
