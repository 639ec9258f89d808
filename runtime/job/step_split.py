"""Where one rank's step time goes: waiting for data, computing, waiting in collectives for the other ranks,
blocked on a checkpoint save, evaluating.

In synchronous data parallelism every rank's step ends at the same collective, so a slow rank makes every rank's
step slow and the step time alone names no one. The split does: the slow rank waits least in collectives and most
for its data or its compute, while the others wait for it.

- data wait: the time in the task's batch iterator (`next(batches)`) and the copy to the device;
- collective wait: the host's time inside collectives, launch to completion, as the engine's `Comm` counts it
  (`zerotrain_comm_seconds_total`): on gloo the transfer and the wait for the slowest rank. Collectives that run
  inside a timed phase (a save's, an evaluation's) are that phase's;
- checkpoint: the step loop blocked on a save (an asynchronous save's copy out, or a whole synchronous one);
- evaluation: the evaluation after the step;
- compute: the rest of the step's wall time (forward, backward, the optimizer step, and the loop's own work).

The phases sum to the step's wall time by construction, compute being the remainder; what each measured phase
costs is two clock reads. On CUDA the collective wait is the host's only (the stream waits are not yet measured
apart: the GPU path is unrun).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    """A share of a rank's step (the `phase` label of `zerotrain_step_phase_seconds_total`)."""

    DATA_WAIT = "data_wait"
    COMPUTE = "compute"
    COLLECTIVE_WAIT = "collective_wait"
    CHECKPOINT = "checkpoint"
    EVALUATION = "evaluation"


TIMED = (Phase.DATA_WAIT, Phase.CHECKPOINT, Phase.EVALUATION)
"""The phases timed around their calls; collective wait is read from the engine's counters, compute is the rest."""


@dataclass(frozen=True)
class StepSplit:
    """One step's wall time by phase, in seconds."""

    seconds: dict[Phase, float]
    """Every phase, summing to `wall`."""
    wall: float
    """The step's wall time, from its first batch to after its evaluation."""

    def __getitem__(self, phase: Phase) -> float:
        return self.seconds[phase]


@dataclass
class StepClock:
    """Times one rank's steps by phase. `collective_seconds` reads the engine's running total of host time spent in
    collectives (its `Comm` stats); `clock` is injectable for tests."""

    collective_seconds: Callable[[], float]
    clock: Callable[[], float] = time.perf_counter
    _start: float = 0.0
    _collective_start: float = 0.0
    _timed: dict[Phase, float] = field(default_factory=dict)
    _collective_inside: float = 0.0

    def begin(self) -> None:
        """A step starts now."""
        self._start, self._collective_start = self.clock(), self.collective_seconds()
        self._timed = dict.fromkeys(TIMED, 0.0)
        self._collective_inside = 0.0

    @contextmanager
    def timing(self, phase: Phase) -> Iterator[None]:
        """Count the time inside the block as `phase` (one of `TIMED`), with any collective it ran."""
        assert phase in TIMED, f"{phase} is not timed around a call"
        t0, c0 = self.clock(), self.collective_seconds()
        try:
            yield
        finally:
            self._timed[phase] += self.clock() - t0
            self._collective_inside += self.collective_seconds() - c0

    def end(self) -> StepSplit:
        """The split of the step since `begin`."""
        wall = self.clock() - self._start
        collective = max(0.0, self.collective_seconds() - self._collective_start - self._collective_inside)
        measured = sum(self._timed.values())
        # Clocks read at different moments can leave the remainder a hair below zero on an all-waiting step.
        collective = min(collective, max(0.0, wall - measured))
        compute = max(0.0, wall - measured - collective)
        seconds = {**self._timed, Phase.COLLECTIVE_WAIT: collective, Phase.COMPUTE: compute}
        return StepSplit({p: seconds[p] for p in Phase}, wall)
