"""The goodput ledger's arithmetic: a job's wall time split into its seven buckets, which sum to it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from zerotrain import goodput
from zerotrain.goodput import Bucket, Ending, GangClock, GangEnd, GoodputSeconds, GoodputStatus

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def clock(start: float, first: float | None, reported: float, **seconds: float) -> GangClock:
    return GangClock(
        process_start=at(start), first_step=None if first is None else at(first), reported_at=at(reported), **seconds
    )


def wall(ledger: GoodputStatus) -> float:
    return (ledger.at - T0).total_seconds()


def test_a_job_that_starts_trains_evaluates_saves_and_succeeds() -> None:
    ledger = goodput.start(T0)
    assert ledger.current == Bucket.PENDING and ledger.seconds.total() == 0
    # The launcher starts at 5 s, the first step begins at 12 s; at 40 s it has evaluated 3 s and saved 2 s.
    starting = goodput.account(ledger, clock(5, None, 8))
    assert starting.seconds == GoodputSeconds(pending=5, starting=3) and starting.current == Bucket.STARTING
    running = goodput.account(ledger, clock(5, 12, 40, evaluating_seconds=3, checkpointing_seconds=2))
    assert running.seconds == GoodputSeconds(pending=5, starting=7, training=23, evaluating=3, checkpointing=2)
    assert running.current == Bucket.TRAINING and running.wall_seconds == wall(running) == 40
    # What readers show at 50 s: the ten seconds since the report are training's.
    assert running.live(at(50)).training == 33
    done = goodput.close(
        running, clock(5, 12, 40, evaluating_seconds=3, checkpointing_seconds=2), end(60, Ending.SUCCEEDED, after=None)
    )
    assert done.seconds == GoodputSeconds(pending=5, starting=7, training=43, evaluating=3, checkpointing=2)
    assert done.current is None and done.live(at(500)) == done.seconds
    assert done.fractions.training == pytest.approx(43 / 60)


def end(seconds: float, ending: Ending, died: float | None = None, after: Bucket | None = Bucket.RESTARTING) -> GangEnd:
    return GangEnd(ending, at(seconds), None if died is None else at(died), after)


def test_a_failure_loses_the_training_since_the_newest_checkpoint_and_the_restart_runs_to_the_next_first_step() -> None:
    ledger = goodput.start(T0)
    # Reported at 40 s: 6 s of training after the newest checkpoint; the rank died at 44 s, the operator saw it at 45.
    first = clock(5, 12, 40, uncommitted_seconds=6)
    closed = goodput.close(goodput.account(ledger, first), first, end(45, Ending.FAILED, died=44))
    assert closed.seconds == GoodputSeconds(pending=5, starting=7, training=22, lost=10, restarting=1)
    assert (closed.current, closed.gap, closed.closed_at) == (Bucket.RESTARTING, Bucket.RESTARTING, at(45))
    # A late report of the dead gang changes nothing; the new gang's launchers start at 50 s, its first step at 58.
    assert goodput.account(closed, clock(5, 12, 44, uncommitted_seconds=10)).seconds == closed.seconds
    second = goodput.account(closed, clock(50, 58, 70))
    assert second.seconds == GoodputSeconds(pending=5, starting=7, training=34, lost=10, restarting=14)
    assert second.wall_seconds == wall(second) == 70


def test_a_stopped_gang_loses_nothing_and_a_suspension_waits_as_pending() -> None:
    ledger = goodput.start(T0)
    running = clock(0, 10, 30, uncommitted_seconds=15)
    preempted = goodput.close(goodput.account(ledger, running), running, end(34, Ending.STOPPED))
    assert preempted.seconds == GoodputSeconds(starting=10, training=24)
    suspended = goodput.close(preempted, clock(40, 45, 60), end(61, Ending.STOPPED, after=Bucket.PENDING))
    assert suspended.seconds == GoodputSeconds(starting=10, training=40, restarting=11)
    assert suspended.current == Bucket.PENDING
    # Let in again at 100 s: the wait was pending and the new gang's start is starting.
    resumed = goodput.account(suspended, clock(100, 104, 110))
    assert resumed.seconds == GoodputSeconds(pending=39, starting=14, training=46, restarting=11)
    assert resumed.wall_seconds == wall(resumed) == 110


def test_a_gang_that_fails_before_its_first_step_counts_as_its_start_and_a_final_failure_as_lost() -> None:
    ledger = goodput.start(T0)
    crashed = goodput.close(ledger, clock(3, None, 6), end(9, Ending.FAILED, died=8))
    assert crashed.seconds == GoodputSeconds(pending=3, starting=6) and crashed.gap == Bucket.RESTARTING
    last = clock(12, 15, 30, uncommitted_seconds=5)
    failed = goodput.close(crashed, last, end(33, Ending.FAILED, died=31, after=None))
    assert failed.seconds == GoodputSeconds(pending=3, starting=6, training=10, lost=8, restarting=6)
    assert failed.current is None and failed.wall_seconds == wall(failed) == 33


def test_the_ledger_survives_the_wire() -> None:
    """The operator keeps it in status: what it reads back after a restart continues the same ledger."""
    closed = goodput.close(goodput.start(T0), clock(5, 12, 40, uncommitted_seconds=6), end(45, Ending.FAILED, died=44))
    again = GoodputStatus.model_validate(closed.to_wire())
    assert again == closed
    assert goodput.account(again, clock(50, 58, 70)) == goodput.account(closed, clock(50, 58, 70))


def test_progress_is_the_steps_done_and_the_time_left_at_the_training_rate() -> None:
    from zerotrain.goodput import duration, progress

    half = progress(150, 300, 75.0)  # 150 steps kept in 75 s of training: 2 steps/s
    assert (half.percent, half.steps_per_second, half.eta_seconds, half.eta) == (50.0, 2.0, 75.0, "1m")
    assert progress(None, 300, 0.0).eta is None and progress(0, 300, 10.0).percent == 0.0  # no step yet
    assert progress(300, 300, 90.0).eta_seconds == 0.0 and progress(300, 300, 90.0).percent == 100.0
    assert [duration(s) for s in (42, 720, 12_000, 3 * 86_400 + 7200)] == ["42s", "12m", "3h20m", "3d2h"]


def test_the_next_gang_is_known_by_its_number_when_it_starts_within_a_second_of_the_last_ones_end() -> None:
    """A recreated gang's launchers may start 0.3 s after the restart, and /proc puts a launcher's start up to a
    second early: gang 1's clock then reads as starting before gang 0's end. Its number says whose it is."""
    ledger = goodput.account(goodput.start(T0), clock(2, 5, 20, gang=0), gang=0)
    ended = goodput.close(ledger, clock(2, 5, 20, gang=0), GangEnd(Ending.STOPPED, at(30)), gang=0)
    early = clock(29.8, 31, 45, gang=1)  # read as 0.2 s before the end
    assert goodput.current_clock(early, ended.closed_at) is None  # by time alone it would be thrown away
    running = goodput.account(ended, early, gang=1)
    assert running.seconds.training == 25 + 14 and running.seconds.restarting == pytest.approx(1)
    assert goodput.account(ended, clock(2, 5, 35, gang=0), gang=1).seconds == ended.seconds  # a late report of gang 0
