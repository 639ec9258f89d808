"""Alert rules for training jobs, as the `groups` of a PrometheusRule (and of a plain Prometheus rule file).

Each alert is a signal (a PromQL expression whose value means something on its own), a comparison and a
duration. Tests evaluate the signals against a live Prometheus, so a renamed metric cannot leave an alert that
silently never fires; `promtool check rules` checks the file the chart ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerotrain.monitoring.queries import JOB_KEY, Scope, straggler

RANK_LABELS = 'zerotrain_job!=""'


@dataclass(frozen=True)
class Alert:
    """One alert rule."""

    name: str
    """Alert name."""
    signal: str
    """PromQL whose value the threshold applies to."""
    condition: str
    """Comparison appended to the signal, e.g. `> 0.92`."""
    duration: str
    """How long the condition must hold (`for`)."""
    severity: str
    """`warning` or `critical`."""
    summary: str
    """One line, with label templates."""
    description: str
    """What it means and what to do."""
    scope: Scope
    """What the signal returns (per rank or per job)."""

    @property
    def expr(self) -> str:
        return f"({self.signal}) {self.condition}"

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.duration,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


ALERTS: tuple[Alert, ...] = (
    Alert(
        "ZeroTrainRankMemoryNearLimit",
        f"zerotrain_device_memory_used_bytes{{{RANK_LABELS}}} / zerotrain_device_memory_limit_bytes{{{RANK_LABELS}}}",
        "> 0.92",
        "5m",
        "warning",
        "Rank {{ $labels.rank }} of {{ $labels.namespace }}/{{ $labels.zerotrain_job }} uses "
        "{{ $value | humanizePercentage }} of its device memory",
        "Above 92% of the device's memory (CUDA: reserved by the allocator; CPU: resident set against the "
        "container limit) for 5 minutes. An out-of-memory failure is close: raise spec.zero.stage, enable "
        "activation checkpointing, or lower the micro-batch. `zerotrain plan` shows what each stage needs.",
        Scope.RANK,
    ),
    Alert(
        "ZeroTrainRankHeartbeatStale",
        f"time() - zerotrain_heartbeat_timestamp_seconds{{{RANK_LABELS}}}"
        f' unless on(namespace, pod, zerotrain_job, rank) zerotrain_phase{{{RANK_LABELS}, phase="finished"}} == 1',
        "> 600",
        "2m",
        "critical",
        "Rank {{ $labels.rank }} of {{ $labels.namespace }}/{{ $labels.zerotrain_job }} made no progress for "
        "{{ $value | humanizeDuration }}",
        "The rank still serves metrics but has not finished a phase for 10 minutes: most likely a hung collective "
        "(a peer stuck or slow). Its `zerotrain_phase` says where it waits; spec.zero.collectiveTimeoutSeconds "
        "bounds how long before it fails on its own.",
        Scope.RANK,
    ),
    Alert(
        "ZeroTrainJobRestartingRepeatedly",
        f"sum by ({JOB_KEY}) (increase(zerotrain_operator_job_restarts_total[1h]))",
        "> 3",
        "0m",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.zerotrain_job }} restarted its gang {{ $value }} times in an hour",
        "Every restart loses the steps since the last checkpoint. `kubectl describe ztj` names each cause; "
        "failures count against failurePolicy.backoffLimit, evictions and preemptions do not.",
        Scope.OPERATOR,
    ),
    Alert(
        "ZeroTrainStragglingRank",
        straggler(RANK_LABELS),
        "> 0",
        "10m",
        "warning",
        "Rank {{ $labels.rank }} of {{ $labels.namespace }}/{{ $labels.zerotrain_job }} holds its gang back "
        "({{ $labels.cause }})",
        "Synchronous data parallelism runs at the pace of its slowest rank, and this one has been named for 10 "
        "minutes: its data wait (cause input) or its compute (cause compute) stands above the other ranks' by "
        "spec.stragglers.threshold. `kubectl describe ztj` names its pod and node. Input: a slow loader or storage "
        "path; compute: a throttled CPU, a slow or shared GPU.",
        Scope.RANK,
    ),
    Alert(
        "ZeroTrainTargetDown",
        f"up{{{RANK_LABELS}}}",
        "== 0",
        "5m",
        "warning",
        "Metrics of {{ $labels.namespace }}/{{ $labels.zerotrain_job }} at {{ $labels.instance }} cannot be scraped",
        "A training pod's rank does not answer on its metrics port (spec.metrics.port + local rank) for 5 "
        "minutes: the rank is gone, or the port is blocked by a NetworkPolicy.",
        Scope.JOB,
    ),
)


def rule_groups() -> dict[str, Any]:
    """The rule file: one group with every alert."""
    return {"groups": [{"name": "zerotrain.training", "rules": [a.rule() for a in ALERTS]}]}
