"""compute_status: the lifecycle as a table of (previous state, observed pods) -> (status, actions)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.controller.conditions import ConditionType, Reason, get_condition, is_true, set_condition
from zerotrain.operator.controller.job_events import transitions
from zerotrain.operator.controller.observe import Disruption, ObservedPod, PodPhase, observe_pod
from zerotrain.operator.controller.status import Backoff, compute_status, invalid

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
BACKOFF = Backoff(base_seconds=10, max_seconds=60)


def spec(**extra: Any) -> Any:
    return parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2, "nprocPerNode": 4, **extra})


def pod(replica: int, phase: PodPhase = PodPhase.RUNNING, gang: int = 0, **kw: Any) -> ObservedPod:
    return ObservedPod(name=f"j-worker-{replica}", replica=replica, gang=gang, phase=phase, ready=True, **kw)


def created(gang: int = 0, failures: int = 0) -> ZeroTrainingJobStatus:
    """A status whose gang `gang` was created (as after the first pass)."""
    st = compute_status(spec(), [], None, NOW - timedelta(minutes=5), BACKOFF).status
    st.restarts.total, st.restarts.failures = gang, failures
    return st


def test_first_pass_creates_the_gang_and_second_changes_nothing() -> None:
    d = compute_status(spec(), [], None, NOW, BACKOFF)
    assert d.create_gang and d.status.phase == Phase.PENDING and d.status.start_time == NOW
    assert is_true(d.status, ConditionType.CREATED, Reason.GANG_CREATED)
    again = compute_status(spec(), [pod(0, PodPhase.PENDING), pod(1, PodPhase.PENDING)], d.status, NOW, BACKOFF)
    assert not again.create_gang and again.delete_pods == []
    assert again.status.model_dump(exclude={"ranks"}) == d.status.model_dump(exclude={"ranks"})


def test_a_gang_created_over_several_passes_keeps_its_creating_condition_and_its_time() -> None:
    """Between the passes that create a large gang (Created=False/GangCreating, set by reconcile) the decision leaves
    the condition as it is: flipping it True each pass would move its lastTransitionTime every pass."""
    first = compute_status(spec(), [], None, NOW, BACKOFF).status
    c = get_condition(first, ConditionType.CREATED)
    assert c is not None
    c.status, c.reason, c.last_transition_time = "False", Reason.GANG_CREATING, NOW
    later = NOW + timedelta(seconds=3)
    d = compute_status(spec(), [pod(0, PodPhase.PENDING)], first, later, BACKOFF)
    assert d.create_gang
    again = get_condition(d.status, ConditionType.CREATED)
    assert again is not None
    assert (again.status, again.reason, again.last_transition_time) == ("False", Reason.GANG_CREATING, NOW)


@pytest.mark.parametrize(
    ("pods", "phase", "failures", "cause", "deleted"),
    [
        ([pod(0), pod(1)], Phase.RUNNING, 0, None, []),
        ([pod(0), pod(1, PodPhase.FAILED, exit_code=1)], Phase.RESTARTING, 1, "Failed", ["j-worker-0", "j-worker-1"]),
        (
            [pod(0), pod(1, PodPhase.FAILED, disruption=Disruption.EVICTED)],
            Phase.RESTARTING,
            0,
            "Evicted",
            ["j-worker-0", "j-worker-1"],
        ),
        (
            [pod(0, PodPhase.SUCCEEDED, disruption=Disruption.PREEMPTED), pod(1)],
            Phase.RESTARTING,
            0,
            "Preempted",
            ["j-worker-0", "j-worker-1"],
        ),
        ([pod(0)], Phase.RESTARTING, 0, "PodDeleted", ["j-worker-0"]),
        ([pod(0, PodPhase.SUCCEEDED), pod(1, PodPhase.SUCCEEDED)], Phase.SUCCEEDED, 0, None, []),
        ([pod(0, PodPhase.SUCCEEDED), pod(1)], Phase.RUNNING, 0, None, []),
        ([pod(0, PodPhase.FAILED, exit_code=2), pod(1)], Phase.FAILED, 0, None, ["j-worker-1"]),
    ],
)
def test_running_gang(
    pods: list[ObservedPod], phase: Phase, failures: int, cause: str | None, deleted: list[str]
) -> None:
    d = compute_status(spec(), pods, created(), NOW, BACKOFF)
    assert d.status.phase == phase
    assert d.status.restarts.failures == failures
    assert d.restart_cause == cause
    assert d.delete_pods == deleted
    if cause:
        assert d.status.restarts.total == 1 and d.status.restarts.by_cause == {cause: 1}
        assert not is_true(d.status, ConditionType.CREATED)


def test_ranks_count_pods_times_nproc() -> None:
    d = compute_status(spec(), [pod(0), pod(1, PodPhase.PENDING)], created(), NOW, BACKOFF)
    assert (d.status.ranks.total, d.status.ranks.running) == (8, 4)


@pytest.mark.parametrize(("failures", "delay"), [(0, 10), (1, 20), (2, 40), (5, 60)])
def test_exponential_backoff_then_recreate(failures: int, delay: float) -> None:
    limit = {"failurePolicy": {"backoffLimit": 10}}
    d = compute_status(
        spec(**limit), [pod(0, PodPhase.FAILED, exit_code=1), pod(1)], created(0, failures), NOW, BACKOFF
    )
    assert d.status.next_restart_time == NOW + timedelta(seconds=delay)
    gang = d.status.restarts.total
    waiting = compute_status(
        spec(**limit), [pod(0, PodPhase.FAILED, exit_code=1, terminating=True)], d.status, NOW, BACKOFF
    )
    assert not waiting.create_gang, "the old gang must be gone first"
    early = compute_status(spec(**limit), [], d.status, NOW + timedelta(seconds=delay - 1), BACKOFF)
    assert not early.create_gang and early.requeue_after == pytest.approx(1.0)
    due = compute_status(spec(**limit), [], d.status, NOW + timedelta(seconds=delay), BACKOFF)
    assert due.create_gang and due.status.restarts.total == gang and due.status.next_restart_time is None


def test_backoff_limit_spent_fails() -> None:
    st = created(gang=2, failures=2)
    d = compute_status(
        spec(failurePolicy={"backoffLimit": 2}),
        [pod(0, PodPhase.FAILED, gang=2, exit_code=1), pod(1, gang=2)],
        st,
        NOW,
        BACKOFF,
    )
    assert d.status.phase == Phase.FAILED and d.status.completion_time == NOW
    assert get_condition(d.status, ConditionType.FAILED).reason == Reason.BACKOFF_LIMIT_EXCEEDED  # type: ignore[union-attr]
    assert d.delete_pods == ["j-worker-1"]


def test_retryable_list_fails_other_codes() -> None:
    s = spec(failurePolicy={"retryableExitCodes": [137]})
    d = compute_status(s, [pod(0, PodPhase.FAILED, exit_code=1), pod(1)], created(), NOW, BACKOFF)
    assert get_condition(d.status, ConditionType.FAILED).reason == Reason.NON_RETRYABLE_EXIT_CODE  # type: ignore[union-attr]


def test_stale_gang_pods_are_deleted() -> None:
    d = compute_status(spec(), [pod(0, gang=1), pod(1, gang=1), pod(0, gang=0)], created(gang=1), NOW, BACKOFF)
    assert "j-worker-0" in d.delete_pods and d.status.phase == Phase.RUNNING


def test_suspend_and_resume_keep_restarts() -> None:
    st = created(gang=1, failures=1)
    d = compute_status(spec(suspend=True), [pod(0, gang=1), pod(1, gang=1)], st, NOW, BACKOFF)
    assert d.status.phase == Phase.SUSPENDED and sorted(d.delete_pods) == ["j-worker-0", "j-worker-1"]
    resumed = compute_status(spec(), [], d.status, NOW, BACKOFF)
    assert resumed.create_gang and resumed.status.restarts.total == 1 and resumed.status.start_time == NOW
    assert get_condition(resumed.status, ConditionType.SUSPENDED).reason == Reason.JOB_RESUMED  # type: ignore[union-attr]


def test_active_deadline() -> None:
    st = created()
    d = compute_status(spec(activeDeadlineSeconds=60), [pod(0), pod(1)], st, NOW, BACKOFF)
    assert get_condition(d.status, ConditionType.FAILED).reason == Reason.DEADLINE_EXCEEDED  # type: ignore[union-attr]
    assert sorted(d.delete_pods) == ["j-worker-0", "j-worker-1"]


@pytest.mark.parametrize(("ttl", "after", "deleted"), [(None, 999, False), (30, 29, False), (30, 30, True)])
def test_ttl_after_finished(ttl: int | None, after: int, deleted: bool) -> None:
    done = compute_status(
        spec(ttlSecondsAfterFinished=ttl),
        [pod(0, PodPhase.SUCCEEDED), pod(1, PodPhase.SUCCEEDED)],
        created(),
        NOW,
        BACKOFF,
    )
    later = compute_status(spec(ttlSecondsAfterFinished=ttl), [], done.status, NOW + timedelta(seconds=after), BACKOFF)
    assert later.delete_job == deleted and later.status.phase == Phase.SUCCEEDED


def test_startup_timeout_condition() -> None:
    old = NOW - timedelta(seconds=700)
    d = compute_status(spec(), [pod(0), pod(1, PodPhase.PENDING, created=old)], created(), NOW, BACKOFF)
    cond = get_condition(d.status, ConditionType.UNSCHEDULABLE)
    assert cond is not None and cond.status == "True" and cond.reason == Reason.STARTUP_TIMEOUT
    assert any(e.type == "Warning" and e.reason == Reason.STARTUP_TIMEOUT for e in transitions(created(), d.status))


def test_invalid_then_fixed() -> None:
    bad = invalid(None, Reason.INVALID_SPEC, "spec.replicas: got 0", NOW)
    assert bad.phase == Phase.FAILED and is_true(bad, ConditionType.INVALID_SPEC)
    fixed = compute_status(spec(), [], bad, NOW, BACKOFF)
    assert fixed.create_gang and not is_true(fixed.status, ConditionType.INVALID_SPEC)


def test_transitions_emit_one_event_per_change() -> None:
    first = compute_status(spec(), [], None, NOW, BACKOFF).status
    assert [e.reason for e in transitions(None, first)] == [Reason.GANG_CREATED]
    assert transitions(first, first) == []


TARGET = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}


def exited(code: int, message: str = "") -> dict[str, Any]:
    return {"name": "trainer", "state": {"terminated": {"exitCode": code, "message": message}}}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Failed", "reason": "Evicted"}, Disruption.EVICTED),
        (
            {
                "phase": "Failed",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
            },
            Disruption.PREEMPTED,
        ),
        ({"phase": "Unknown"}, Disruption.NODE_LOST),
        (  # Kueue stopping a preempted workload's pods (before it deletes them)
            {
                "phase": "Running",
                "conditions": [
                    {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPreempted"}
                ],
            },
            Disruption.PREEMPTED,
        ),
        (
            {
                "phase": "Running",
                "conditions": [
                    {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPodsReadyTimeout"}
                ],
            },
            Disruption.EVICTED,
        ),
        (
            {
                "phase": "Succeeded",
                "containerStatuses": [
                    {"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": "preempted at step 7"}}}
                ],
            },
            Disruption.PREEMPTED,
        ),
        ({"phase": "Succeeded", "containerStatuses": [exited(0, "done")]}, None),
        ({"phase": "Failed", "containerStatuses": [exited(1)]}, None),
    ],
)
def test_observe_disruptions(status: dict[str, Any], expected: Disruption | None) -> None:
    p = observe_pod({"metadata": {"name": "p", "labels": {"zerotrain.dev/gang": "0"}}, "status": status})
    assert p.disruption == expected


def test_a_gang_whose_pods_kueue_deleted_restarts_as_preempted() -> None:
    """Kueue deletes a preempted workload's pods itself (its finalizer keeps them a while): the restart's cause is
    the one its condition gives, not a deletion, and no back-off is spent."""
    leaving = pod(1, terminating=True, disruption=Disruption.PREEMPTED)
    d = compute_status(spec(), [pod(0), leaving], created(), NOW, BACKOFF)
    assert d.restart_cause == "Preempted" and d.status.restarts.failures == 0


def test_invalid_spec_posts_one_warning() -> None:
    bad = invalid(None, Reason.INVALID_SPEC, "spec.replicas: got 0", NOW)
    events = transitions(None, bad)
    assert [(e.type, e.reason) for e in events] == [("Warning", Reason.INVALID_SPEC)]


def test_a_container_the_kernel_oom_killed_is_out_of_memory() -> None:
    pod = {
        "metadata": {"name": "j-worker-0", "labels": {}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
            ],
        },
    }
    assert "OOMKilled" in observe_pod(pod).out_of_memory
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "Error"
    assert observe_pod(pod).out_of_memory == ""


def test_a_launcher_that_refused_the_job_fails_it_at_once_with_its_line() -> None:
    # What `python -m zerotrain.runtime` writes when its entry check refuses the job, before any rank starts.
    line = "spec.entrypointArgs: build() got an unexpected keyword argument 'n_layer'; fix the name or remove it"
    failed = {
        "metadata": {"name": "j-worker-0", "labels": {"zerotrain.dev/gang": "0", "zerotrain.dev/replica-index": "0"}},
        "status": {"phase": "Failed", "containerStatuses": [exited(2, f"invalid-config: {line} (exit status 2)")]},
    }
    observed = observe_pod(failed)
    assert observed.invalid_config == line
    # No exit-code rule lists 2 here: the refusal is judged by what it says, not by its code.
    s = spec(failurePolicy={"permanentExitCodes": [], "backoffLimit": 5})
    d = compute_status(s, [observed, pod(1)], created(), NOW, BACKOFF)
    failed_condition = get_condition(d.status, ConditionType.FAILED)
    assert d.status.phase == Phase.FAILED and failed_condition is not None
    assert failed_condition.reason == Reason.INVALID_CONFIG
    assert failed_condition.message == f"pod j-worker-0 (node rank 0) refused the job before any rank started: {line}"
    assert d.status.restarts.failures == 0 and d.delete_pods == ["j-worker-1"]
    events = transitions(created(), d.status)
    assert ("Warning", Reason.INVALID_CONFIG) in [(e.type, e.reason) for e in events], events


def test_a_rank_failure_is_not_read_as_a_refusal() -> None:
    said = "rank-failed: rank 0 failed first: it exited with status 1: invalid-config: in the user's own text"
    failed = {
        "metadata": {"name": "p", "labels": {}},
        "status": {"phase": "Failed", "containerStatuses": [exited(1, said)]},
    }
    assert observe_pod(failed).invalid_config == ""


def test_what_admission_decided_is_recorded_in_the_same_status() -> None:
    from zerotrain.operator.controller.pass_facts import PassFacts
    from zerotrain.plan.model_states import PlanInput, plan
    from zerotrain.zero_config import Stage

    memory = plan(PlanInput(parameters=1_000_000, data_parallel=8))
    previous = created()
    set_condition(previous, ConditionType.QUEUE_UNAVAILABLE, True, Reason.LOCAL_QUEUE_NOT_FOUND, "no queue", NOW)
    facts = PassFacts(Stage.GRADIENTS, memory, "stage 2 is the lowest that fits", generation=7, queue="team-a")
    d = compute_status(spec(), [pod(0), pod(1)], previous, NOW, BACKOFF, facts=facts)
    st = d.status
    assert (st.stage, st.memory_plan, st.observed_generation) == (Stage.GRADIENTS, memory, 7)
    chosen = get_condition(st, ConditionType.STAGE_CHOSEN)
    assert chosen is not None and chosen.message == "stage 2 is the lowest that fits"
    queue = get_condition(st, ConditionType.QUEUE_UNAVAILABLE)
    assert queue is not None and queue.status == "False" and queue.message == "LocalQueue 'team-a' found"
    # Without facts (the tests of the lifecycle alone) nothing of admission's is written.
    bare = compute_status(spec(), [pod(0), pod(1)], created(), NOW, BACKOFF).status
    assert bare.memory_plan is None and get_condition(bare, ConditionType.STAGE_CHOSEN) is None
