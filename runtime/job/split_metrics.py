"""The step split and straggler metrics of one rank (`step_split`, `stragglers`), as a collector of its own on the
rank's registry:

- `zerotrain_step_phase_seconds_total{phase}`: seconds of this rank's steps by phase (data_wait, compute,
  collective_wait, checkpoint, evaluation), summing to the steps' wall time;
- `zerotrain_straggler{cause}`: 1 while the last window named this rank as holding the gang back for that cause
  (input or compute), else 0; `zerotrain_straggler_ratio`: its data wait or compute per step over the other ranks'
  median, while named;
- `zerotrain_goodput_seconds{bucket}`: this run's time from its launcher's start by goodput bucket (starting,
  training, evaluating, checkpointing: `gang_clock.Timekeeper.split`); a cluster job's whole ledger, across its
  gangs, is the operator's `zerotrain_operator_job_goodput_seconds`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerotrain.goodput import Bucket, GoodputSeconds
from zerotrain.job_status import StragglerCause
from zerotrain.runtime.job.step_split import Phase, StepSplit
from zerotrain.runtime.job.stragglers import Straggler


class SplitMetrics(Collector):
    """Totals by phase and this rank's straggler verdict; the loop replaces each value whole (scrapes run on
    another thread)."""

    def __init__(self, labels: Mapping[str, str], rank: int) -> None:
        self.names, self.values, self.rank = list(labels), list(labels.values()), rank
        self.totals: dict[Phase, float] = dict.fromkeys(Phase, 0.0)
        self.run = GoodputSeconds()
        self.named: dict[StragglerCause, float] = {}
        """Cause → ratio, while this rank is named."""

    def observe_split(self, split: StepSplit, run: GoodputSeconds) -> None:
        self.totals = {p: self.totals[p] + split[p] for p in Phase}
        self.run = run

    def observe_stragglers(self, named: list[Straggler]) -> None:
        self.named = {s.cause: s.ratio for s in named if s.rank == self.rank}

    def collect(self) -> Iterator[Metric]:
        phases = CounterMetricFamily(
            "zerotrain_step_phase_seconds",
            "Seconds of this rank's steps by phase: data_wait, compute, collective_wait, checkpoint, evaluation.",
            labels=[*self.names, "phase"],
        )
        for phase, seconds in self.totals.items():
            phases.add_metric([*self.values, phase.value], seconds)
        yield phases
        run = GaugeMetricFamily(
            "zerotrain_goodput_seconds",
            "This run's seconds from its launcher's start by goodput bucket (starting, training, evaluating, "
            "checkpointing).",
            labels=[*self.names, "bucket"],
        )
        ran = self.run
        for bucket in (Bucket.STARTING, Bucket.TRAINING, Bucket.EVALUATING, Bucket.CHECKPOINTING):
            run.add_metric([*self.values, bucket.value], ran.get(bucket))
        yield run
        flag = GaugeMetricFamily(
            "zerotrain_straggler",
            "1 while the last window named this rank as holding the gang back for that cause (input, compute).",
            labels=[*self.names, "cause"],
        )
        named = self.named
        for cause in StragglerCause:
            flag.add_metric([*self.values, cause.value], 1.0 if cause in named else 0.0)
        yield flag
        ratio = GaugeMetricFamily(
            "zerotrain_straggler_ratio",
            "While named: this rank's data wait or compute per step over the other ranks' median.",
            labels=[*self.names, "cause"],
        )
        for cause, value in named.items():
            ratio.add_metric([*self.values, cause.value], value)
        yield ratio
