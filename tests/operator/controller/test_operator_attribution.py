"""Truthful failure attribution and waiting reasons: the first rank to fail on its own decides, a rank that only lost
its peer never triggers the exit-code rules, and a container that cannot start is named with the kubelet's reason."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.controller.conditions import ConditionType, get_condition
from zerotrain.operator.controller.observe import ObservedPod, PodPhase, observe_pod
from zerotrain.operator.controller.status import Backoff, compute_status

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
PEER_LOST = "rank-failed: PeerLostError: rank 0: all_gather for unit 'Block.1' failed because a peer rank is gone"


def spec(**extra: Any) -> Any:
    doc = {"image": "i", "entrypoint": "m:f", "replicas": 3, "failurePolicy": {"permanentExitCodes": [2]}}
    return parse_spec({**doc, **extra})


def created() -> ZeroTrainingJobStatus:
    return compute_status(spec(), [], None, NOW - timedelta(minutes=5), Backoff()).status


def failed(replica: int, code: int, seconds_ago: float, peer_lost: bool = False) -> ObservedPod:
    return ObservedPod(
        name=f"j-worker-{replica}",
        replica=replica,
        gang=0,
        phase=PodPhase.FAILED,
        exit_code=code,
        finished=NOW - timedelta(seconds=seconds_ago),
        peer_lost=peer_lost,
    )


def running(replica: int) -> ObservedPod:
    return ObservedPod(name=f"j-worker-{replica}", replica=replica, gang=0, phase=PodPhase.RUNNING, ready=True)


def test_the_earliest_failure_decides_not_the_lowest_rank() -> None:
    # Rank 2 failed first with a retryable code; rank 0 exited 2 (permanent) 5 s later, because of it.
    d = compute_status(spec(), [failed(0, 2, 5), running(1), failed(2, 1, 10)], created(), NOW, Backoff())
    assert d.status.phase == Phase.RESTARTING and d.restart_cause == "Failed"
    assert "j-worker-2" in (get_condition(d.status, ConditionType.RESTARTING).message or "")


def test_a_permanent_code_from_the_first_failure_fails_the_job() -> None:
    d = compute_status(spec(), [failed(0, 1, 5), running(1), failed(2, 2, 10)], created(), NOW, Backoff())
    assert d.status.phase == Phase.FAILED
    assert "j-worker-2" in (get_condition(d.status, ConditionType.FAILED).message or "")


def test_a_rank_that_only_lost_its_peer_never_triggers_the_exit_code_rules() -> None:
    d = compute_status(spec(), [failed(0, 2, 5, peer_lost=True), running(1), running(2)], created(), NOW, Backoff())
    assert d.status.phase == Phase.RESTARTING, "exit 2 after a lost peer says nothing about the program"
    assert "after losing a peer rank" in (get_condition(d.status, ConditionType.RESTARTING).message or "")
    # Even when it ended first, a rank that failed on its own is the cause.
    d = compute_status(
        spec(), [failed(0, 1, 20, peer_lost=True), running(1), failed(2, 2, 5)], created(), NOW, Backoff()
    )
    assert d.status.phase == Phase.FAILED and "j-worker-2" in (
        get_condition(d.status, ConditionType.FAILED).message or ""
    )


def kubelet_pod(waiting: dict[str, str] | None = None, message: str = "") -> dict[str, Any]:
    state = (
        {"waiting": waiting}
        if waiting
        else {"terminated": {"exitCode": 2, "message": message, "finishedAt": "2026-01-01T11:59:00Z"}}
    )
    return {
        "metadata": {
            "name": "j-worker-0",
            "labels": {"zerotrain.dev/replica-index": "0", "zerotrain.dev/gang": "0"},
            "creationTimestamp": "2026-01-01T11:50:00Z",
        },
        "status": {
            "phase": "Pending" if waiting else "Failed",
            "containerStatuses": [{"name": "trainer", "state": state}],
        },
    }


def test_observe_reads_finish_time_peer_loss_and_waiting_reason() -> None:
    done = observe_pod(kubelet_pod(message=PEER_LOST))
    assert done.peer_lost and done.finished == datetime(2026, 1, 1, 11, 59, tzinfo=timezone.utc)
    stuck = observe_pod(kubelet_pod({"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}))
    assert stuck.waiting == "ImagePullBackOff" and 'Back-off pulling image "x:1"' in stuck.waiting_message


def test_a_container_that_cannot_start_shows_its_reason_not_not_scheduled() -> None:
    pod = observe_pod(kubelet_pod({"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}))
    quick = spec(replicas=1, scheduling={"startupTimeoutSeconds": 60})
    d = compute_status(quick, [pod], created(), NOW, Backoff())
    cond = get_condition(d.status, ConditionType.CONTAINERS_WAITING)
    assert cond is not None and cond.status == "True" and cond.reason == "CreateContainerConfigError"
    assert 'secret "hf-token" not found' in (cond.message or "")
    late = get_condition(d.status, ConditionType.UNSCHEDULABLE)  # Pending for 10 min, past the 60 s timeout
    assert late is not None and "CreateContainerConfigError" in (late.message or "")
    assert "not scheduled" not in (late.message or "")
    ok = compute_status(quick, [running(0)], d.status, NOW, Backoff())
    assert get_condition(ok.status, ConditionType.CONTAINERS_WAITING).status == "False"
