"""Stragglers named with their cause: the rank whose data wait or compute stands out from the others' over a window
of steps.

Every rank's step ends at the same collective, so every rank's step time is the slowest rank's and comparing step
times names no one (on main the quickstart with one rank's batches 150 ms late showed a step-time ratio of 1.005).
The step's split (`step_split`) does name it: the slow rank waits longest for its data, or computes longest, while
the others wait for it in collectives. Every `window` steps each rank's summed data wait, compute and step time go
to every rank in one small all-reduce (each rank fills its own row), and each rank applies the same rule:

    rank r straggles on cause c (input: data wait; compute) when, by its median step of the window,
        c_r ≥ threshold × median(c of the other ranks)   and   c_r − that median ≥ FLOOR × the median step time

Each rank's median step, not its mean: a one-off pause (an import on a thread, the scheduler of a shared host) is
not a pace, and a rank slowed for good is slow in most of its steps. The median of the *other* ranks, not of all:
with two ranks the median of all is the mean of the slow and the fast,
and a rank 1.5× slower would stand only 1.2× above it. The floor keeps noise in phases that take nearly nothing (a
data wait of microseconds that doubles) from naming anyone. A rank slow on both counts is named with the cause that
costs the gang more. A rank is named once the rule has held for it in two windows in a row (on a shared host a
neighbour can slow one rank for one window: `make demo` beside a compile named rank 0 1.35x slow for a window and
not the next), and cleared once it has not held in two windows in a row.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from zerotrain.job_status import StragglerCause, StragglerStatus
from zerotrain.runtime.job.step_split import Phase, StepSplit

if TYPE_CHECKING:
    from zerotrain.runtime.zero.collectives import Comm

FLOOR = 0.05
"""A straggler's excess must be at least this share of the gang's median step time (and the threshold's ratio)."""


@dataclass(frozen=True)
class RankWindow:
    """One rank's window: the median of its steps' data wait, compute and wall time."""

    data_wait: float
    compute: float
    wall: float


@dataclass(frozen=True)
class Straggler:
    """A rank named, with what it was measured at."""

    rank: int
    cause: StragglerCause
    seconds_per_step: float
    """Its data wait (input) or compute in its median step of the window."""
    others_per_step: float
    """The median of the other ranks' figures over the same window."""
    window: int
    """Steps in the window."""

    @property
    def ratio(self) -> float:
        return self.seconds_per_step / self.others_per_step if self.others_per_step > 0 else float("inf")

    def status(self, step: int) -> dict[str, object]:
        """The entry of the job's `status.stragglers` (camelCase, as the CRD names it) for a verdict at `step`."""
        return StragglerStatus(
            rank=self.rank,
            cause=self.cause,
            seconds_per_step=round(self.seconds_per_step, 6),
            others_seconds_per_step=round(self.others_per_step, 6),
            window_steps=self.window,
            step=step,
        ).to_wire()

    def message(self) -> str:
        what = "data wait" if self.cause is StragglerCause.INPUT else "compute"
        times = f"{self.ratio:.2f}×" if self.others_per_step > 0 else "the others near 0"
        return (
            f"rank {self.rank} holds the gang back ({self.cause.value}): {what} {self.seconds_per_step:.3f} s/step "
            f"against the other ranks' {self.others_per_step:.3f} s/step ({times}), medians of the last "
            f"{self.window} steps"
        )


def find_stragglers(table: list[RankWindow], threshold: float, window: int) -> list[Straggler]:
    """The ranks `table` (per-step figures of every rank, by rank) names, at most one cause each."""
    if len(table) < 2:
        return []
    step = statistics.median(r.wall for r in table)
    found = []
    for rank, mine in enumerate(table):
        others = [r for i, r in enumerate(table) if i != rank]
        named = []
        for cause, value in ((StragglerCause.INPUT, mine.data_wait), (StragglerCause.COMPUTE, mine.compute)):
            median = statistics.median(r.data_wait if cause is StragglerCause.INPUT else r.compute for r in others)
            if value >= threshold * median and value - median >= FLOOR * step:
                named.append((value - median, Straggler(rank, cause, value, median, window)))
        if named:
            found.append(max(named, key=lambda n: n[0])[1])
    return found


CLEAR_AFTER = 2
"""Windows in a row within the threshold that clear a named rank (as two in a row beyond it name one)."""


class StragglerWatch:
    """Sums one rank's splits over the window and, at its end, exchanges them with every rank and judges: a rank is
    named once the rule has held for it two windows in a row, and cleared once it has not held two windows in a row
    (a window that clears alone is the moment, not the rank: on a shared host one window of a slowed rank can look
    healthy, as one of a healthy rank can look slow)."""

    def __init__(self, comm: Comm, device: torch.device, threshold: float, window: int) -> None:
        self.comm, self.device, self.threshold, self.window = comm, device, threshold, window
        self._steps: list[tuple[float, float, float]] = []
        self._held: set[tuple[int, StragglerCause]] = set()
        """(rank, cause) the rule held for in the last window."""
        self._named: dict[tuple[int, StragglerCause], Straggler] = {}
        self._misses: dict[tuple[int, StragglerCause], int] = {}

    def observe(self, split: StepSplit) -> list[Straggler] | None:
        """Add a step; at the window's end (a collective on every rank) the stragglers, else None."""
        self._steps.append((split[Phase.DATA_WAIT], split[Phase.COMPUTE], split.wall))
        if len(self._steps) < self.window:
            return None
        mine = [statistics.median(column) for column in zip(*self._steps, strict=True)]
        table = torch.zeros(self.comm.world_size, 3, dtype=torch.float64, device=self.device)
        table[self.comm.rank] = torch.tensor(mine, dtype=torch.float64)
        self.comm.all_reduce(table, "<stragglers>", label="stragglers")
        rows = [RankWindow(*map(float, row)) for row in table.tolist()]
        steps, self._steps = len(self._steps), []
        return self.judge(find_stragglers(rows, self.threshold, steps))

    def judge(self, found: list[Straggler]) -> list[Straggler]:
        """The ranks named after this window's findings (see the class), in rank order."""
        now = {(s.rank, s.cause): s for s in found}
        for key, straggler in now.items():
            if key in self._named or key in self._held:  # named, or held two windows in a row: named now
                self._named[key], self._misses[key] = straggler, 0
        for key in [k for k in self._named if k not in now]:
            self._misses[key] = self._misses.get(key, 0) + 1
            if self._misses[key] >= CLEAR_AFTER:
                del self._named[key], self._misses[key]
        self._held = set(now)
        return sorted(self._named.values(), key=lambda s: (s.rank, s.cause.value))
