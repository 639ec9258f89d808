"""What the training loop reports to: one step's values, the `MetricsSink` protocol, and `NoMetrics` (metrics off).
`RankMetrics` (rank_metrics) is the sink that exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from zerotrain.runtime.rank_phase import RankPhase

if TYPE_CHECKING:
    from zerotrain.goodput import GoodputSeconds
    from zerotrain.runtime.job.step_split import StepSplit
    from zerotrain.runtime.job.stragglers import Straggler
    from zerotrain.runtime.zero.engine import ZeroEngine


@dataclass(frozen=True)
class StepValues:
    """One optimizer step as the loop saw it."""

    step: int
    """The loop's step number (1-based; moves on fp16-skipped steps too)."""
    seconds: float
    """Wall time of the step: micro-batches, optimizer, checkpoint."""
    loss: float
    """Mean loss over the global batch."""
    grad_norm: float | None
    """Global gradient norm (None when the step did not compute it)."""
    learning_rate: float
    """Learning rate of the first parameter group after the step."""
    loss_scale: float
    """fp16 loss scale used for the step (1 otherwise)."""
    applied: bool
    """The optimizer stepped."""
    skipped: bool
    """fp16 overflow: the step was skipped."""
    tokens: int
    """Tokens this rank processed in the step."""


class MetricsSink(Protocol):
    """What the training loop reports its phases and observations to: `RankMetrics`, or `NoMetrics`."""

    def phase(self, phase: RankPhase) -> None: ...
    def observe_step(self, engine: ZeroEngine, values: StepValues) -> None: ...
    def observe_save(self, step: int, seconds: float, nbytes: int) -> None: ...
    def observe_evaluation(self, step: int, loss: float) -> None: ...
    def observe_blocked(self, seconds: float) -> None: ...
    def observe_load(self, step: int, seconds: float, nbytes: int) -> None: ...
    def observe_split(self, split: StepSplit, run: GoodputSeconds) -> None: ...
    def observe_stragglers(self, named: list[Straggler]) -> None: ...


class NoMetrics:
    """Metrics off (a rank started outside the launcher, a bench's baseline): every observation is dropped."""

    def phase(self, phase: RankPhase) -> None:
        pass

    def observe_step(self, engine: ZeroEngine, values: StepValues) -> None:
        pass

    def observe_save(self, step: int, seconds: float, nbytes: int) -> None:
        pass

    def observe_evaluation(self, step: int, loss: float) -> None:
        pass

    def observe_blocked(self, seconds: float) -> None:
        pass

    def observe_load(self, step: int, seconds: float, nbytes: int) -> None:
        pass

    def observe_split(self, split: StepSplit, run: GoodputSeconds) -> None:
        pass

    def observe_stragglers(self, named: list[Straggler]) -> None:
        pass
