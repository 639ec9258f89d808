"""Rank 0's clock of its gang, for the goodput ledger (`zerotrain.goodput`): when the pod's launcher started, when
the first step began, the seconds since spent evaluating and blocked in saves, and the training after the newest
committed checkpoint (what a failure now would lose). Each progress report carries a reading of it into
status.gangClock, and `zerotrain run`'s summary its split of the run."""

from __future__ import annotations

import os
import time
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

from zerotrain.goodput import Bucket, GangClock, GoodputSeconds, seconds_in
from zerotrain.pod_contract import GANG_ENV, LAUNCHER_PID_ENV, ROUND_STARTED_ENV
from zerotrain.runtime.job.step_split import Phase, StepSplit

_IMPORTED = time.time()


def process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from Linux's /proc; None elsewhere."""
    try:
        # Field 22 of /proc/PID/stat, in clock ticks since boot; the command name (field 2) may hold spaces.
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line[:5] == "btime")
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def launcher_start() -> float:
    """When this rank's launcher (the pod's main process, or `zerotrain run`) started this round of ranks: the
    round's start where the launcher ran rounds before it (an in-place restart), else the launcher's own start; where
    /proc is not there, when this module was imported."""
    with suppress(ValueError):
        return float(os.environ.get(ROUND_STARTED_ENV) or "")
    pid = os.environ.get(LAUNCHER_PID_ENV)
    started = process_start(int(pid)) if pid and pid.isdigit() else None
    return started or process_start(os.getpid()) or _IMPORTED


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


class Timekeeper:
    """The gang's clock as rank 0's loop keeps it (every rank keeps one; rank 0's is reported)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = launcher_start() if started is None else started
        gang = os.environ.get(GANG_ENV, "")
        self.gang = int(gang) if gang.isdigit() else None
        """The gang this rank belongs to (the pod's gang label, or its in-place round), fixed for its life."""
        self.first_step: float | None = None
        self.evaluating = self.checkpointing = 0.0
        self._trained_at_end: dict[int, float] = {}
        """Training seconds at the end of each step not yet committed."""
        self._commits: list[int] = []
        """Steps committed before they ended (a synchronous save within its step)."""
        self._committed = 0.0
        """Training seconds at the end of the newest committed step (0: the checkpoint this gang resumed from)."""

    def begin(self, now: float | None = None) -> None:
        """A step begins (the first one starts the gang's training)."""
        if self.first_step is None:
            self.first_step = time.time() if now is None else now

    def committed(self, step: int, now: float | None = None) -> None:
        """A checkpoint of `step` was committed. Reported at once, so it counts at once: from the end of `step`
        when that has passed (an asynchronous save commits steps later), else from now, and from the step's end
        once it ends."""
        if step not in self._trained_at_end:
            self._commits.append(step)
        self._committed = self._trained_at_end.get(step, self.training(now))
        self._trained_at_end = {s: t for s, t in self._trained_at_end.items() if s > step}

    def end(self, step: int, split: StepSplit, now: float | None = None) -> None:
        """Step `step` ended with `split`."""
        self.evaluating += split.seconds.get(Phase.EVALUATION, 0.0)
        self.checkpointing += split.seconds.get(Phase.CHECKPOINT, 0.0)
        self._trained_at_end[step] = self.training(now)
        if step in self._commits:
            self._committed = self._trained_at_end.pop(step)
        self._commits.clear()

    def training(self, now: float | None = None) -> float:
        """Seconds since the first step, less evaluation and blocked saves."""
        if self.first_step is None:
            return 0.0
        since = (time.time() if now is None else now) - self.first_step
        return max(0.0, since - self.evaluating - self.checkpointing)

    def reading(self, now: float | None = None) -> GangClock:
        """The clock as status.gangClock carries it."""
        now = time.time() if now is None else now
        return GangClock(
            gang=self.gang,
            process_start=_at(self.started),
            first_step=None if self.first_step is None else _at(self.first_step),
            reported_at=_at(now),
            evaluating_seconds=self.evaluating,
            checkpointing_seconds=self.checkpointing,
            uncommitted_seconds=max(0.0, self.training(now) - self._committed),
        )

    def split(self, now: float | None = None) -> GoodputSeconds:
        """This run's time from its launcher's start (a local run has nothing pending, lost or restarting)."""
        now = time.time() if now is None else now
        first = self.first_step if self.first_step is not None else now
        return seconds_in(
            [
                (Bucket.STARTING, first - self.started),
                (Bucket.TRAINING, self.training(now)),
                (Bucket.EVALUATING, self.evaluating),
                (Bucket.CHECKPOINTING, self.checkpointing),
            ]
        )
