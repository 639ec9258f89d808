"""The goodput ledger: where a job's wall time went, bucket by bucket (docs/monitoring.md, "Goodput").

Two sides keep it. Rank 0 reads its gang's clock (`GangClock`: when the pod's launcher started, when the first
step began, the seconds since spent evaluating and blocked in saves, and the training seconds after the newest
committed checkpoint) into `status.gangClock` with every progress report. The operator folds that clock into
`status.goodput` (`account`), and closes a gang's share of it when the gang ends. Everything the ledger needs lives
in the job's status, so it survives gang restarts and operator restarts alike.

The buckets partition the wall time from the job's creation by construction: every interval goes to exactly one.
Pure and torch-free: the operator, the runtime and `zerotrain top` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from pydantic import Field

from zerotrain._model import SpecModel


class Bucket(str, Enum):
    """Where a second of the job's wall time went."""

    PENDING = "pending"
    """Before the gang's launchers started: admission, a queue, scheduling, pulling images (and a suspension)."""
    STARTING = "starting"
    """From the launchers starting to the first step (of the first gang, or the first after a suspension):
    imports, building the model, loading weights."""
    TRAINING = "training"
    """From a gang's first step to its end, less evaluation, blocked saves and lost work."""
    EVALUATING = "evaluating"
    """Evaluation passes (spec.training.evaluation)."""
    CHECKPOINTING = "checkpointing"
    """Saves the training loop waited for (an asynchronous save blocks only while it copies)."""
    LOST = "lost"
    """Training after the newest committed checkpoint of a gang that failed: its steps are trained again."""
    RESTARTING = "restarting"
    """From a gang's failure or stop until the next gang's first step (its pending and starting included)."""


class GoodputSeconds(SpecModel):
    """Seconds (or fractions of the wall time) per bucket."""

    pending: float = Field(default=0.0, ge=0)
    """Waiting for admission and placement, before any launcher started."""
    starting: float = Field(default=0.0, ge=0)
    """Imports, model construction and loading up to the first step (of the first gang, or after a suspension)."""
    training: float = Field(default=0.0, ge=0)
    """Steps kept: the goodput."""
    evaluating: float = Field(default=0.0, ge=0)
    """Evaluation passes."""
    checkpointing: float = Field(default=0.0, ge=0)
    """Saves the loop was blocked on."""
    lost: float = Field(default=0.0, ge=0)
    """Steps computed after the newest committed checkpoint of a gang that failed."""
    restarting: float = Field(default=0.0, ge=0)
    """From a gang's end to the next gang's first step."""

    def get(self, bucket: Bucket) -> float:
        return float(getattr(self, bucket.value))

    def total(self) -> float:
        return sum(self.get(b) for b in Bucket)

    def plus(self, other: GoodputSeconds) -> GoodputSeconds:
        return GoodputSeconds(**{b.value: self.get(b) + other.get(b) for b in Bucket})

    def fractions(self) -> GoodputSeconds:
        """Each bucket over the whole (zeros when no time has passed)."""
        whole = self.total()
        return GoodputSeconds(**{b.value: (self.get(b) / whole if whole > 0 else 0.0) for b in Bucket})


def summary_line(seconds: GoodputSeconds) -> str:
    """Where the time went, largest bucket first, as shares of the whole: 'goodput 62.0% of 40.1 s: training
    62.0%, starting 30.1%, ...' (the goodput is the training's share)."""
    whole = seconds.total()
    if whole <= 0:
        return "goodput: no time counted yet"
    shown = sorted(((seconds.get(b), b.value) for b in Bucket if seconds.get(b) > 0), reverse=True)
    parts = ", ".join(f"{name} {s / whole:.1%}" for s, name in shown)
    return f"goodput {seconds.training / whole:.1%} of {whole:.1f} s: {parts}"


def seconds_in(parts: list[tuple[Bucket, float]]) -> GoodputSeconds:
    """Seconds from (bucket, seconds) pairs, each clamped at 0 (clocks of two machines may disagree by a little)."""
    totals: dict[str, float] = {}
    for bucket, s in parts:
        totals[bucket.value] = totals.get(bucket.value, 0.0) + max(0.0, s)
    return GoodputSeconds(**totals)


class GangClock(SpecModel):
    """Rank 0's reading of its gang's clock, sent with each progress report (the operator never writes it)."""

    gang: int | None = Field(default=None, ge=0)
    """The gang the ranks belong to (status.restarts.total when it began); null outside a job's pods. The operator
    takes the running gang's clock alone."""
    process_start: datetime
    """When the pod's launcher process (or its in-place round) started."""
    first_step: datetime | None = None
    """When the gang's first step began; null while it starts."""
    reported_at: datetime
    """When rank 0 read the clock."""
    evaluating_seconds: float = Field(default=0.0, ge=0)
    """Seconds since the first step spent in evaluation."""
    checkpointing_seconds: float = Field(default=0.0, ge=0)
    """Seconds since the first step the loop was blocked in saves."""
    uncommitted_seconds: float = Field(default=0.0, ge=0)
    """Training seconds after the newest committed checkpoint: what a failure now would lose."""

    def training_seconds(self) -> float:
        """The rest of the time since the first step."""
        if self.first_step is None:
            return 0.0
        since = (self.reported_at - self.first_step).total_seconds()
        return max(0.0, since - self.evaluating_seconds - self.checkpointing_seconds)


class GoodputStatus(SpecModel):
    """The job's goodput ledger (status.goodput), kept by the operator from rank 0's clock."""

    seconds: GoodputSeconds = Field(default_factory=GoodputSeconds)
    """Seconds per bucket from the job's creation to `at`; they sum to wallSeconds."""
    fractions: GoodputSeconds = Field(default_factory=GoodputSeconds)
    """Each bucket over wallSeconds (fractions.training is the job's goodput)."""
    wall_seconds: float = Field(default=0.0, ge=0)
    """Wall time from the job's creation to `at`."""
    at: datetime
    """The time the seconds run to: the newest report of rank 0's clock, the end of a gang, or the job's end."""
    current: Bucket | None = None
    """Where the time since `at` goes until the next report (null once the job finished): readers such as
    `zerotrain top` add it there."""
    closed: GoodputSeconds = Field(default_factory=GoodputSeconds)
    """The seconds of the gangs that ended, through closedAt (the operator's own record)."""
    closed_at: datetime
    """Where `closed` ends: the job's creation, then each gang's end."""
    gap: Bucket = Bucket.PENDING
    """What the time from closedAt to the next gang's first step counts as: pending (and the gang's start as
    starting) for the first gang and after a suspension, restarting after a restart."""

    def live(self, now: datetime) -> GoodputSeconds:
        """The seconds through `now`, the time since `at` added to `current`."""
        if self.current is None:
            return self.seconds
        extra = max(0.0, (now - self.at).total_seconds())
        return self.seconds.plus(seconds_in([(self.current, extra)]))


class Ending(str, Enum):
    """How a gang ended, which says whether its uncommitted steps were lost."""

    FAILED = "failed"
    """A rank failed (or its node vanished): the steps after the newest committed checkpoint are lost."""
    STOPPED = "stopped"
    """The gang was stopped (preempted, evicted, resized, suspended): SIGTERM made it commit its step first."""
    SUCCEEDED = "succeeded"
    """Every rank finished."""


@dataclass(frozen=True)
class GangEnd:
    """A gang's end, as the pass that saw it decided."""

    ending: Ending
    at: datetime
    """When the operator decided it."""
    died: datetime | None = None
    """When the failed rank's container ended, if known (its finishedAt): the lost work runs to here, and the
    restart from here."""
    after: Bucket | None = Bucket.RESTARTING
    """Where the time after it goes: restarting (another gang follows), pending (the job is suspended) or None
    (the job finished)."""


def current_clock(clock: GangClock | None, since: datetime, gang: int | None = None) -> GangClock | None:
    """The clock if it belongs to the running gang, number `gang`, running since `since` (a late report of an
    ended gang does not). By number where both are known: the launchers' start, read from /proc, may be a second
    early, and a recreated gang's start within a second of the last one's end."""
    if clock is None:
        return None
    if clock.gang is not None and gang is not None:
        return clock if clock.gang == gang else None
    return clock if clock.process_start >= since else None


def open_share(since: datetime, gap: Bucket, clock: GangClock | None) -> tuple[GoodputSeconds, datetime, Bucket]:
    """The running gang's seconds from `since` to its newest report, the time they run to, and where the time
    after it goes. Without a report of this gang every second is still the gap's."""
    start_bucket = Bucket.STARTING if gap == Bucket.PENDING else Bucket.RESTARTING
    if clock is None:
        return GoodputSeconds(), since, gap
    began = max(clock.process_start, since)  # a start read a moment before `since`: that moment is counted there
    waited = (gap, (began - since).total_seconds())
    if clock.first_step is None:
        started = (clock.reported_at - began).total_seconds()
        return seconds_in([waited, (start_bucket, started)]), clock.reported_at, start_bucket
    parts = [
        waited,
        (start_bucket, (clock.first_step - began).total_seconds()),
        (Bucket.TRAINING, clock.training_seconds()),
        (Bucket.EVALUATING, clock.evaluating_seconds),
        (Bucket.CHECKPOINTING, clock.checkpointing_seconds),
    ]
    return seconds_in(parts), clock.reported_at, Bucket.TRAINING


def start(created: datetime) -> GoodputStatus:
    """A new job's ledger: nothing yet, everything from its creation pending."""
    return GoodputStatus(at=created, closed_at=created, current=Bucket.PENDING)


def account(ledger: GoodputStatus, clock: GangClock | None, gang: int | None = None) -> GoodputStatus:
    """The ledger with the running gang's (number `gang`) newest report folded in (unchanged when there is none)."""
    share, at, current = open_share(ledger.closed_at, ledger.gap, current_clock(clock, ledger.closed_at, gang))
    return _view(ledger, ledger.closed.plus(share), at, current)


def close(ledger: GoodputStatus, clock: GangClock | None, end: GangEnd, gang: int | None = None) -> GoodputStatus:
    """The ledger with the running gang closed at `end.at`: its share through its last report; then, for a gang
    that trained, the time to its end (training when it finished or was stopped, lost when it failed) and from its
    death to `end.at` (where the time after it goes, or lost when nothing follows a failure). `gang`: its number."""
    clock = current_clock(clock, ledger.closed_at, gang)
    share, at, current = open_share(ledger.closed_at, ledger.gap, clock)
    parts: list[tuple[Bucket, float]] = []
    if clock is not None and clock.first_step is not None:
        died = end.at if end.died is None else min(max(end.died, at), end.at)
        if end.ending == Ending.FAILED:
            kept = max(0.0, share.training - clock.uncommitted_seconds)
            parts.append((Bucket.LOST, (share.training - kept) + (died - at).total_seconds()))
            parts.append((end.after or Bucket.LOST, (end.at - died).total_seconds()))
            share = share.model_copy(update={"training": kept})
        else:
            parts.append((Bucket.TRAINING, (end.at - at).total_seconds()))
    else:  # it ended before its first step: its whole time is the gap's, or its start's
        parts.append((current, (end.at - at).total_seconds()))
    closed = ledger.closed.plus(share).plus(seconds_in(parts))
    gap = ledger.gap if end.after is None else end.after
    ended = ledger.model_copy(update={"closed": closed, "closed_at": end.at, "gap": gap})
    return _view(ended, closed, end.at, end.after)


def _view(ledger: GoodputStatus, seconds: GoodputSeconds, at: datetime, current: Bucket | None) -> GoodputStatus:
    wall = seconds.total()
    return ledger.model_copy(
        update={
            "seconds": seconds,
            "fractions": seconds.fractions(),
            "wall_seconds": wall,
            "at": at,
            "current": current,
        }
    )


class JobProgress(SpecModel):
    """How far the job is and when it will finish (status.progress), from the ledger's training rate: the seconds
    of steps kept, so time queued, starting, restarting, evaluating, checkpointing or lost to failures does not slow
    the rate (the estimate assumes none of them ahead)."""

    percent: float = Field(ge=0, le=100)
    """Steps done of spec.training.steps, in per cent."""
    steps_per_second: float | None = Field(default=None, ge=0)
    """Steps kept per second of training; null before the first step."""
    eta_seconds: float | None = Field(default=None, ge=0)
    """Training seconds left at that rate; null before the first step, 0 once every step ran."""
    eta: str | None = None
    """eta_seconds for a person (`kubectl get ztj`'s ETA column): 45s, 12m, 3h20m, 2d4h."""


def progress(step: int | None, steps: int, training_seconds: float) -> JobProgress:
    """The job's progress at `step` of `steps` after `training_seconds` of kept steps."""
    done = max(0, min(step or 0, steps))
    rate = done / training_seconds if done and training_seconds > 0 else None
    left = None if rate is None else (steps - done) / rate
    return JobProgress(
        percent=round(100.0 * done / steps, 1) if steps else 100.0,
        steps_per_second=None if rate is None else round(rate, 6),
        eta_seconds=None if left is None else round(left, 1),
        eta=None if left is None else duration(left),
    )


def duration(seconds: float) -> str:
    """A duration as kubectl shows ages: the two largest units."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
