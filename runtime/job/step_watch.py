"""One rank's steps as the loop watches them: each step split by phase (`step_split`) into the metrics, and every
window the gang's stragglers (`stragglers`) into the metrics, rank 0's progress and the job's status, when the
verdict changes."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from zerotrain.runtime.job.gang_clock import Timekeeper
from zerotrain.runtime.job.metrics_sink import MetricsSink
from zerotrain.runtime.job.progress import ProgressSink
from zerotrain.runtime.job.step_split import Phase, StepClock, StepSplit
from zerotrain.runtime.job.stragglers import Straggler, StragglerWatch
from zerotrain.spec import StragglerSpec

if TYPE_CHECKING:
    from zerotrain.runtime.zero.engine import ZeroEngine


def collective_seconds(engine: ZeroEngine) -> float:
    """Host seconds this rank has spent inside collectives so far (every op the engine's `Comm` counted)."""
    return sum(op.seconds for op in engine.comm.stats.ops.values())


class StepWatch:
    """The clock of every step and, with more than one rank, the straggler watch."""

    def __init__(
        self,
        engine: ZeroEngine,
        spec: StragglerSpec,
        device: torch.device,
        metrics: MetricsSink,
        log: ProgressSink,
    ) -> None:
        self.clock = StepClock(lambda: collective_seconds(engine))
        self.time = Timekeeper()
        """The gang's clock for the goodput ledger (rank 0's reports carry it)."""
        log.follow(self.time)
        self.metrics, self.log = metrics, log
        self.watch: StragglerWatch | None = None
        if spec.enabled and engine.comm.world_size > 1:
            self.watch = StragglerWatch(engine.comm, device, spec.threshold, spec.window_steps)
        self.named: list[Straggler] | None = None
        """The last verdict: the ranks named at the end of the last window (empty: the gang keeps pace; None:
        no window ended yet, so the first verdict is always reported and clears one a previous gang left)."""
        self.history: list[dict[str, object]] = []
        """Every rank named in this run: rank, cause, the step it was named after and the step it was cleared
        after (the last step when it never was), as the summary records them."""
        self._open: dict[tuple[int, str], dict[str, object]] = {}
        self.last_step: int | None = None

    def begin(self) -> None:
        self.time.begin()
        self.clock.begin()

    def committed(self, step: int) -> None:
        """A checkpoint of `step` was committed: the training up to it is no longer at risk."""
        self.time.committed(step)

    def timing(self, phase: Phase) -> AbstractContextManager[None]:
        return self.clock.timing(phase)

    def end(self, step: int) -> StepSplit:
        """The step's split, reported; at a window's end (a collective on every rank) the verdict, when it
        changed."""
        split = self.clock.end()
        self.time.end(step, split)
        self.metrics.observe_split(split, self.time.split())
        verdict = self.watch.observe(split) if self.watch is not None else None
        if verdict is not None and (self.named is None or _key(verdict) != _key(self.named)):
            self.named = verdict
            self.metrics.observe_stragglers(verdict)
            self.log.stragglers(step, verdict)
            self._record(step, verdict)
        self.last_step = step
        return split

    def _record(self, step: int, named: list[Straggler]) -> None:
        now = set(_key(named))
        for key in [k for k in self._open if k not in now]:
            self._open.pop(key)["to_step"] = step
        for rank, cause in now - set(self._open):
            entry: dict[str, object] = {"rank": rank, "cause": cause, "from_step": step, "to_step": None}
            self._open[(rank, cause)] = entry
            self.history.append(entry)

    def stragglers(self) -> list[dict[str, object]]:
        """`history`, the ranks still named counted to the last step."""
        return [{**e, "to_step": e["to_step"] if e["to_step"] is not None else self.last_step} for e in self.history]


def _key(named: list[Straggler]) -> list[tuple[int, str]]:
    return [(s.rank, s.cause.value) for s in named]
