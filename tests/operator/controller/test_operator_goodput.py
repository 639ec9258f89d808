"""status.goodput through compute_status: rank 0's clock folded in pass by pass, a failed gang closed with its lost
work, a preempted one with none, and the ledger read back from the wire (an operator restart) going on unchanged."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from zerotrain.goodput import Bucket, GangClock
from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.controller.observe import Disruption, ObservedPod, PodPhase
from zerotrain.operator.controller.pass_facts import PassFacts
from zerotrain.operator.controller.status import Backoff, compute_status
from zerotrain.zero_config import Stage

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)
SPEC = parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2})
FACTS = PassFacts(Stage.PARAMETERS, created=T0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pod(replica: int, gang: int = 0, phase: PodPhase = PodPhase.RUNNING, **kw: Any) -> ObservedPod:
    return ObservedPod(name=f"j-worker-{replica}", replica=replica, gang=gang, phase=phase, ready=True, **kw)


def step(previous: ZeroTrainingJobStatus | None, pods: list[ObservedPod], now: float) -> ZeroTrainingJobStatus:
    """One pass, its status written and read back as the next pass (or a restarted operator) reads it."""
    st = compute_status(SPEC, pods, previous, at(now), Backoff(base_seconds=0), facts=FACTS).status
    return ZeroTrainingJobStatus.model_validate(st.to_wire())


def reported(st: ZeroTrainingJobStatus, clock: GangClock) -> ZeroTrainingJobStatus:
    """Rank 0's merge patch of status.gangClock."""
    return st.model_copy(update={"gang_clock": clock})


def test_a_failed_gang_loses_its_uncommitted_steps_and_the_ledger_survives_the_wire() -> None:
    st = step(None, [], 1)  # the gang is created a second after the job
    assert st.goodput is not None and st.goodput.current == Bucket.PENDING and st.goodput.wall_seconds == 0
    st = step(st, [pod(0), pod(1)], 4)
    first = GangClock(process_start=at(5), first_step=at(20), reported_at=at(50), uncommitted_seconds=8)
    st = step(reported(st, first), [pod(0), pod(1)], 51)
    assert st.goodput is not None and st.goodput.seconds.training == 30 and st.goodput.at == at(50)
    # Rank 1 died at 55 s (finishedAt whole seconds: taken as 55.5); the operator saw it at 57.
    failed = [pod(0), pod(1, phase=PodPhase.FAILED, exit_code=1, finished=at(55))]
    st = step(st, failed, 57)
    g = st.goodput
    assert g is not None and st.restarts.total == 1
    assert (g.seconds.training, g.seconds.lost, g.seconds.restarting) == (22, 13.5, 1.5)
    assert g.wall_seconds == 57 and g.current == Bucket.RESTARTING
    # The next gang: its clock, not the old one's late report, moves the ledger on.
    st = step(st, [], 58)
    st = step(st, [pod(0, gang=1), pod(1, gang=1)], 59)
    second = GangClock(process_start=at(60), first_step=at(70), reported_at=at(80))
    st = step(reported(st, second), [pod(0, gang=1), pod(1, gang=1)], 81)
    g = st.goodput
    assert g is not None
    assert (g.seconds.training, g.seconds.lost, g.seconds.restarting) == (32, 13.5, 14.5)
    assert g.seconds.pending == 5 and g.seconds.starting == 15
    assert g.wall_seconds == (g.at - T0).total_seconds() == 80
    done = [pod(0, gang=1, phase=PodPhase.SUCCEEDED), pod(1, gang=1, phase=PodPhase.SUCCEEDED)]
    st = step(st, done, 90)
    g = st.goodput
    assert g is not None and g.current is None and g.seconds.training == 42 and g.wall_seconds == 90
    assert step(st, done, 200).goodput == g  # a finished job's ledger stays as it is


def test_a_preempted_gang_loses_nothing() -> None:
    st = step(None, [], 0)
    clock = GangClock(process_start=at(2), first_step=at(10), reported_at=at(30), uncommitted_seconds=12)
    preempted = [pod(0), pod(1, phase=PodPhase.SUCCEEDED, disruption=Disruption.PREEMPTED)]
    st = step(reported(st, clock), preempted, 33)
    g = st.goodput
    assert g is not None and st.restarts.by_cause == {"Preempted": 1}
    assert (g.seconds.training, g.seconds.lost, g.seconds.restarting) == (23, 0, 0)


def test_the_progress_runs_at_the_ledgers_training_rate_and_a_restart_does_not_slow_it() -> None:
    spec = parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2, "training": {"steps": 200}})

    def pass_(previous: ZeroTrainingJobStatus | None, pods: list[ObservedPod], now: float) -> ZeroTrainingJobStatus:
        st = compute_status(spec, pods, previous, at(now), Backoff(base_seconds=0), facts=FACTS).status
        return ZeroTrainingJobStatus.model_validate(st.to_wire())

    st = pass_(None, [pod(0), pod(1)], 1)
    assert st.progress is None  # no step reported yet
    first = GangClock(process_start=at(5), first_step=at(10), reported_at=at(50), uncommitted_seconds=10)
    st = pass_(reported(st, first).model_copy(update={"step": 40}), [pod(0), pod(1)], 51)
    assert st.progress is not None and (st.progress.percent, st.progress.steps_per_second) == (20.0, 1.0)
    assert (st.progress.eta_seconds, st.progress.eta) == (160.0, "2m")
    # A failure at 60 s, 30 s of restarting, the new gang back at the checkpoint (step 30) and then step 60.
    failed = [pod(0), pod(1, phase=PodPhase.FAILED, exit_code=1, finished=at(60))]
    st = pass_(st, failed, 60)
    second = GangClock(process_start=at(80), first_step=at(90), reported_at=at(120))
    st = pass_(reported(st, second).model_copy(update={"step": 60}), [pod(0, gang=1), pod(1, gang=1)], 121)
    assert st.progress is not None and st.goodput is not None
    # 60 steps kept in 30 + 30 s of training: the restart and the lost steps do not lower the rate.
    assert st.goodput.seconds.training == 60 and st.progress.steps_per_second == 1.0
    assert st.progress.eta_seconds == 140.0


def test_an_in_place_restart_counts_each_second_once() -> None:
    """The same failure as above, recovered in place: the kept launchers' old rounds report no more, the new round's
    clock starts with the round (not the launcher process), and at every pass the buckets add up to the wall time."""
    spec = parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2, "checkpoint": {"claimName": "ckpt"}})

    def kept(replica: int, gang: int, round_: int, ended: int | None = None, **kw: Any) -> ObservedPod:
        phase = PodPhase.PENDING if round_ < gang else kw.pop("phase", PodPhase.RUNNING)
        return pod(replica, gang, phase, alive=True, round=round_, round_ended=ended, **kw)

    def go(previous: ZeroTrainingJobStatus, pods: list[ObservedPod], now: float) -> ZeroTrainingJobStatus:
        st = compute_status(spec, pods, previous, at(now), Backoff(base_seconds=0), facts=FACTS).status
        g = st.goodput
        assert g is not None and abs(sum(g.seconds.model_dump().values()) - g.wall_seconds) < 1e-9, g
        return ZeroTrainingJobStatus.model_validate(st.to_wire())

    st = go(ZeroTrainingJobStatus(), [], 1)
    st = go(st, [kept(0, 0, 0), kept(1, 0, 0)], 4)
    first = GangClock(process_start=at(5), first_step=at(20), reported_at=at(50), uncommitted_seconds=8)
    st = go(reported(st, first), [kept(0, 0, 0), kept(1, 0, 0)], 51)
    # Rank 1's round ended at 55 s (its launcher's record); the operator saw it at 57 and kept both pods.
    ended = kept(1, 0, 0, 0, phase=PodPhase.FAILED, exit_code=137, finished=at(55))
    st = go(st, [kept(0, 0, 0), ended], 57)
    assert st.restarts.in_place == 1
    g = st.goodput
    assert g is not None and (g.seconds.training, g.seconds.lost, g.seconds.restarting) == (22, 13.5, 1.5)
    # Moved, stopped, told to start: round 1 starts at 59 s in the same processes, which started at 5 s. A late
    # report of round 0's clock (its launcher's start) changes nothing.
    st = go(reported(st, first), [kept(0, 1, 0, 0), kept(1, 1, 0, 0)], 58)
    assert st.goodput is not None and st.goodput.seconds == g.seconds
    second = GangClock(process_start=at(59), first_step=at(63), reported_at=at(80))
    st = go(reported(st, second), [kept(0, 1, 1), kept(1, 1, 1)], 81)
    g = st.goodput
    assert g is not None
    assert (g.seconds.training, g.seconds.lost, g.seconds.restarting) == (39, 13.5, 7.5)
    assert g.seconds.pending == 5 and g.seconds.starting == 15 and g.wall_seconds == 80
