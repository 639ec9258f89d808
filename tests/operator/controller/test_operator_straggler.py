"""Condition Straggler from the runtime's `status.stragglers`: the rank named with its pod and node, a Warning Event
when it appears, cleared when the gang keeps pace again or stops running, and absent for a job that never
straggled."""

from __future__ import annotations

from datetime import datetime, timezone

from zerotrain.job_status import Phase, StragglerStatus, ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import ConditionType, get_condition
from zerotrain.operator.controller.job_events import transitions
from zerotrain.operator.controller.observe import ObservedPod, PodPhase
from zerotrain.operator.controller.straggler_condition import set_straggler

NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)
PODS = [
    ObservedPod(name=f"llm-worker-{r}", replica=r, gang=0, phase=PodPhase.RUNNING, node=f"node-{r}") for r in range(2)
]


def slow(rank: int, cause: str = "input") -> StragglerStatus:
    figures = {"secondsPerStep": 0.3, "othersSecondsPerStep": 0.2, "windowSteps": 10, "step": 20}
    return StragglerStatus.model_validate({"rank": rank, "cause": cause, **figures})


def test_a_named_rank_gets_its_pod_and_node_and_a_warning_event() -> None:
    before = ZeroTrainingJobStatus(phase=Phase.RUNNING)
    st = before.model_copy(deep=True)
    st.stragglers = [slow(3)]  # rank 3 of 2 pods × 2 ranks: the second pod
    set_straggler(st, PODS, nproc_per_node=2, now=NOW)
    c = get_condition(st, ConditionType.STRAGGLER)
    assert c is not None and (c.status, c.reason) == ("True", "SlowInput")
    assert c.message == (
        "rank 3 (pod llm-worker-1 on node node-1) holds the gang back (input): data wait 0.300 s/step against the "
        "other ranks' median 0.200, 1.50×, over the 10 steps to step 20"
    )
    (event,) = transitions(before, st)
    assert (event.type, event.reason) == ("Warning", "SlowInput") and "node-1" in event.message


def test_it_clears_when_the_gang_keeps_pace_or_stops_running_and_a_job_that_never_straggled_has_none() -> None:
    st = ZeroTrainingJobStatus(phase=Phase.RUNNING)
    set_straggler(st, PODS, 1, NOW)
    assert get_condition(st, ConditionType.STRAGGLER) is None
    st.stragglers = [slow(1, "compute")]
    set_straggler(st, PODS, 1, NOW)
    assert get_condition(st, ConditionType.STRAGGLER).reason == "SlowCompute"  # type: ignore[union-attr]
    named = st.model_copy(deep=True)
    st.stragglers = []
    set_straggler(st, PODS, 1, NOW)
    c = get_condition(st, ConditionType.STRAGGLER)
    assert c is not None and (c.status, c.reason) == ("False", "GangKeepsPace")
    (event,) = transitions(named, st)
    assert (event.type, event.reason) == ("Normal", "GangKeepsPace")
    # A gang that stopped running straggles no more, whatever its last report said.
    named.phase = Phase.RESTARTING
    set_straggler(named, PODS, 1, NOW)
    assert get_condition(named, ConditionType.STRAGGLER).status == "False"  # type: ignore[union-attr]


def test_a_rank_whose_pod_is_gone_is_named_by_rank_alone() -> None:
    st = ZeroTrainingJobStatus(phase=Phase.RUNNING, stragglers=[slow(7)])
    set_straggler(st, PODS, 1, NOW)
    assert get_condition(st, ConditionType.STRAGGLER).message.startswith("rank 7 holds")  # type: ignore[union-attr]
