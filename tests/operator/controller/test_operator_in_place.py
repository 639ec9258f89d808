"""In-place restarts, decided (compute_status), observed (a launcher's round annotations) and written (act): the
living pods are kept and moved into the next gang, the gone ones recreated beside them, and nothing starts before
every kept pod stopped its old ranks."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import kubernetes
import pytest

from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, naming
from zerotrain.operator.client.kube import Kube
from zerotrain.operator.controller.conditions import ConditionType, Reason, get_condition
from zerotrain.operator.controller.observe import Disruption, PodPhase, observe_pod
from zerotrain.operator.controller.pass_facts import PassFacts
from zerotrain.operator.controller.reconcile import Reconciler
from zerotrain.operator.controller.status import Backoff, Decision, compute_status
from zerotrain.operator.settings import OperatorSettings
from zerotrain.pod_contract import ROUND_ANNOTATION, ROUND_END_ANNOTATION, ROUND_EXIT
from zerotrain.pod_rounds import RoundEnd
from zerotrain.training_spec import RestartStrategy
from zerotrain.zero_config import Stage

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
BACKOFF = Backoff(base_seconds=10, max_seconds=60)
JOB = builders.JobRef("j", "ns", "uid-1")


def spec(**extra: Any) -> Any:
    base = {"image": "i", "entrypoint": "m:f", "replicas": 2, "checkpoint": {"claimName": "ckpt"}}
    return parse_spec({**base, **extra})


def wire(
    replica: int,
    gang: int = 0,
    round_: int | str | None = 0,
    ended: RoundEnd | None = None,
    phase: str = "Running",
    **status: Any,
) -> dict[str, Any]:
    """A pod as the API server holds it: built by the operator for gang `round_`, labelled `gang`, with the
    launcher's round-end annotation when given."""
    pod = builders.build_pod(JOB, spec(), replica, int(round_) if isinstance(round_, int) else 0)
    md = pod["metadata"]
    md["labels"][naming.LABEL_GANG] = str(gang)
    md["annotations"] = {} if round_ is None else {ROUND_ANNOTATION: str(round_)}
    if ended is not None:
        md["annotations"][ROUND_END_ANNOTATION] = ended.annotation()
    pod["status"] = {"phase": phase, **status}
    return pod


def ended(round_: int, code: int, message: str, seconds: float = 0) -> RoundEnd:
    return RoundEnd(round=round_, exit_code=code, message=message, finished_at=NOW + timedelta(seconds=seconds))


def running(gang: int) -> ZeroTrainingJobStatus:
    """Gang `gang` created and running."""
    st = compute_status(spec(), [], None, NOW - timedelta(minutes=5), BACKOFF).status
    st.restarts.total = gang
    st.phase = Phase.RUNNING
    return st


def decide(pods: list[dict[str, Any]], previous: ZeroTrainingJobStatus, now: datetime = NOW, **kw: Any) -> Decision:
    s = kw.pop("job_spec", None) or spec()
    return compute_status(s, [observe_pod(p) for p in pods], previous, now, BACKOFF, **kw)


KILLED = "rank-failed: rank 1 failed first: it was killed by SIGKILL (exit status 137)"
PEER = "rank-failed: rank 0 failed first: PeerLostError: a peer rank is gone (exit status 1)"


def test_a_round_reported_ended_reads_as_its_container_ending() -> None:
    failed = observe_pod(wire(1, ended=ended(0, 137, KILLED)))
    assert (failed.phase, failed.exit_code, failed.alive, failed.between_rounds) == (PodPhase.FAILED, 137, True, True)
    assert failed.finished == NOW and not failed.peer_lost
    assert observe_pod(wire(0, ended=ended(0, 1, PEER))).peer_lost
    saved = observe_pod(wire(0, ended=ended(0, 0, "preempted: SIGTERM from a peer (exit status 0)")))
    assert (saved.phase, saved.disruption, saved.alive) == (PodPhase.SUCCEEDED, Disruption.PREEMPTED, True)
    # Moved into gang 1 and not yet told to start: it waits, ready or not, whatever it reported of round 0.
    waiting = observe_pod(wire(0, gang=1, ended=ended(0, 1, PEER), conditions=[{"type": "Ready", "status": "True"}]))
    assert (waiting.phase, waiting.ready, waiting.round, waiting.round_ended) == (PodPhase.PENDING, False, 0, 0)
    # An operator's pod from before rounds, and a container that really ended, read as they always did.
    assert observe_pod(wire(0, round_=None)).phase == PodPhase.RUNNING
    gone = observe_pod(
        wire(1, phase="Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": {"exitCode": 137}}}])
    )
    assert (gone.phase, gone.exit_code, gone.alive) == (PodPhase.FAILED, 137, False)
    assert observe_pod(wire(0, round_=ROUND_EXIT)).exiting


def test_a_failed_rank_restarts_the_gang_in_place_keeping_every_living_pod() -> None:
    pods = [wire(0, ended=ended(0, 1, PEER, 1)), wire(1, ended=ended(0, 137, KILLED))]
    d = decide(pods, running(0))
    r = d.status.restarts
    assert (r.total, r.failures, r.by_cause, r.in_place, r.strategy) == (
        1,
        1,
        {"Failed": 1},
        1,
        RestartStrategy.IN_PLACE,
    )
    assert d.move_pods == ["j-worker-0", "j-worker-1"] and d.delete_pods == [] and d.restart_cause == "Failed"
    assert d.died == NOW  # the killed rank's round ended first: the cause, not the peer that lost it
    restarting = get_condition(d.status, ConditionType.RESTARTING)
    assert restarting is not None and "j-worker-1 (node rank 1) exited with code 137" in restarting.message
    assert "in place: 2 of 2 pods kept" in restarting.message


def test_a_gone_pod_is_recreated_beside_the_kept_one() -> None:
    """Pod 1's container ended (its node went, or its launcher died): it is deleted, pod 0 kept; the next pass waits
    for pod 1 to go, then creates it mounting pod 0's config while pod 0 is told to start round 1."""
    gone = wire(1, phase="Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": {"exitCode": 137}}}])
    d = decide([wire(0), gone], running(0))
    assert d.move_pods == ["j-worker-0"] and d.delete_pods == ["j-worker-1"]
    later = NOW + timedelta(seconds=BACKOFF.delay(1) + 1)
    # Moved, still running its round-0 ranks (its launcher has not yet seen the move): nothing starts.
    held = decide([wire(0, gang=1)], d.status, later)
    assert not held.create_gang and not held.start_pods and held.requeue_after is not None
    # Its ranks stopped (round 0 reported ended): pod 1 is created, pod 0 told to start round 1.
    go = decide(
        [wire(0, gang=1, ended=ended(0, 128 + 9, "stopped: the operator restarts the gang in place"))], d.status, later
    )
    assert go.create_gang and go.start_pods == ["j-worker-0"] and go.delete_pods == []
    # Before the back-off passed the gang waits, kept pods and all.
    early = decide([wire(0, gang=1, ended=ended(0, 137, "stopped"))], d.status, NOW + timedelta(seconds=1))
    assert not early.create_gang and not early.start_pods


def test_a_kept_pod_the_cache_still_shows_in_the_old_gang_is_moved_not_deleted() -> None:
    d = decide([wire(0, ended=ended(0, 1, PEER)), wire(1, ended=ended(0, 137, KILLED))], running(0))
    again = decide([wire(0, ended=ended(0, 1, PEER)), wire(1, gang=1, ended=ended(0, 137, KILLED))], d.status)
    assert again.move_pods == ["j-worker-0"] and again.delete_pods == [] and not again.create_gang


def test_a_kept_pod_that_does_not_stop_in_time_is_recreated_and_named() -> None:
    d = decide([wire(0), wire(1, ended=ended(0, 137, KILLED))], running(0))
    stuck = [wire(0, gang=1), wire(1, gang=1, ended=ended(0, 137, KILLED))]
    budget = spec().failure_policy.rejoin_timeout_seconds
    assert decide(stuck, d.status, NOW + timedelta(seconds=budget - 1)).delete_pods == []
    late = decide(stuck, d.status, NOW + timedelta(seconds=budget + 1))
    assert late.delete_pods == ["j-worker-0"] and not late.create_gang
    c = get_condition(late.status, ConditionType.RESTARTING)
    assert c is not None and c.reason == Reason.REJOIN_TIMEOUT
    assert c.message.startswith("pod(s) j-worker-0 did not stop their ranks of round 0 within failurePolicy.")


@pytest.mark.parametrize(
    ("job_spec", "why"),
    [
        (spec(failurePolicy={"restartStrategy": "Recreate"}), "asked for"),
        (parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2}), "no checkpoint claim to find"),
    ],
)
def test_recreate_where_asked_or_where_in_place_cannot_apply(job_spec: Any, why: str) -> None:
    d = decide([wire(0), wire(1, ended=ended(0, 137, KILLED))], running(0), job_spec=job_spec)
    assert d.move_pods == [] and d.delete_pods == ["j-worker-0", "j-worker-1"], why
    assert d.status.restarts.strategy == RestartStrategy.RECREATE and d.status.restarts.in_place == 0


def test_a_kueue_group_is_kept_whole_or_recreated_whole() -> None:
    facts = PassFacts(Stage.PARAMETERS, None, None, 1, "team-queue", NOW)
    whole = decide([wire(0), wire(1, ended=ended(0, 137, KILLED))], running(0), facts=facts)
    assert whole.move_pods == ["j-worker-0", "j-worker-1"]  # no pod gone: the group is not queued again
    gone = wire(1, phase="Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": {"exitCode": 137}}}])
    lost = decide([wire(0), gone], running(0), facts=facts)
    assert lost.move_pods == [] and lost.delete_pods == ["j-worker-0", "j-worker-1"]


def test_out_of_memory_under_stage_auto_recreates_the_gang_at_the_next_stage() -> None:
    oom = "rank-failed: out of memory: rank 1 ran out (exit status 1)"
    d = decide([wire(0, ended=ended(0, 1, PEER, 1)), wire(1, ended=ended(0, 1, oom))], running(0), replan=True)
    assert d.restart_cause == Reason.OUT_OF_MEMORY and d.move_pods == []
    assert d.delete_pods == ["j-worker-0", "j-worker-1"]


def test_a_failed_job_tells_its_waiting_launchers_to_exit_and_keeps_their_pods() -> None:
    """backoffLimit spent: pods between rounds are told to end (they stay Failed, with their logs), not deleted."""
    st = running(0)
    st.restarts.failures = spec().failure_policy.backoff_limit
    d = decide([wire(0, ended=ended(0, 1, PEER, 1)), wire(1, ended=ended(0, 137, KILLED))], st)
    assert d.status.phase == Phase.FAILED
    assert d.exit_pods == ["j-worker-0", "j-worker-1"] and d.delete_pods == []
    told = [
        wire(0, round_=ROUND_EXIT, ended=ended(0, 1, PEER)),
        wire(1, round_=ROUND_EXIT, ended=ended(0, 137, KILLED)),
    ]
    after = decide(told, d.status, NOW + timedelta(seconds=1))
    assert after.exit_pods == [] and after.delete_pods == []


def reconciler() -> Reconciler:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"  # never called: the writes are stand-ins
    return Reconciler(kube=Kube(cfg), settings=OperatorSettings())


def test_the_writer_moves_starts_and_creates_beside_kept_pods_with_their_config() -> None:
    """Kept pods are patched (gang label, then round annotation); the recreated pod mounts the kept pods' config,
    and no ConfigMap is created or deleted while pods mount the old one."""
    r = reconciler()
    sent: list[tuple[str, str, dict[str, Any]]] = []
    mu = threading.Lock()
    kept = wire(0, gang=1, ended=ended(0, 137, "stopped"))

    def record(verb: str) -> Any:
        def send(*args: Any) -> None:
            with mu:
                obj = args[-1] if verb != "patch" else args[2]
                name = args[1] if verb == "patch" else obj["metadata"]["name"]
                sent.append((verb, name, obj))

        return send

    r.client.pods = lambda ns, name: [kept]  # type: ignore[method-assign]
    r.client.patch_pod = record("patch")  # type: ignore[method-assign]
    r.client.create_pod = record("create")  # type: ignore[method-assign]
    r.kube.ensure = record("ensure")  # type: ignore[method-assign]
    st = running(1)
    d = Decision(st, create_gang=True, start_pods=["j-worker-0"], move_pods=["j-worker-0"])
    try:
        acted = r.writer.act(JOB, spec(), spec(), d, supporting=False)
    finally:
        r.close()
    assert acted.gang_created == (2, 2)
    patches = [(n, o) for v, n, o in sent if v == "patch"]
    assert patches == [
        ("j-worker-0", {"metadata": {"labels": {naming.LABEL_GANG: "1"}}}),
        ("j-worker-0", {"metadata": {"annotations": {ROUND_ANNOTATION: "1"}}}),
    ]
    (created,) = [o for v, _, o in sent if v == "create"]
    assert created["metadata"]["name"] == "j-worker-1" and created["metadata"]["annotations"][ROUND_ANNOTATION] == "1"
    config = next(v for v in created["spec"]["volumes"] if v["name"] == naming.CONFIG_VOLUME)
    assert config["configMap"]["name"] == "j-config-0"
    assert not [v for v, _, _ in sent if v == "ensure"]  # no ConfigMap of gang 1


def test_a_gang_created_afresh_after_in_place_restarts_deletes_every_config_kept_pods_may_mount() -> None:
    """Gang 3, created afresh after two in-place restarts (gangs 1 and 2 kept gang 0's pods, which mounted
    j-config-0): the configs of gangs 0 to 2 are deleted by name, with no listing (a read on every restart)."""
    r = reconciler()
    deleted: list[str] = []
    r.client.pods = lambda ns, name: []  # type: ignore[method-assign]
    r.client.create_pod = lambda pod: None  # type: ignore[method-assign]
    r.kube.ensure = lambda obj: True  # type: ignore[method-assign]
    r.kube.delete_config_map = lambda ns, name: deleted.append(name)  # type: ignore[method-assign]
    st = running(3)
    st.restarts.in_place = 2
    try:
        r.writer.act(JOB, spec(), spec(), Decision(st, create_gang=True), supporting=False)
    finally:
        r.close()
    assert sorted(deleted) == ["j-config-0", "j-config-1", "j-config-2"]
