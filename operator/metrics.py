"""The operator's Prometheus metrics, in their own registry (so tests and several operators don't collide)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerotrain.goodput import Bucket, GoodputStatus
from zerotrain.job_status import Phase, Resize
from zerotrain.zero_config import Stage

JobKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class JobView:
    """What the per-job series show of one job: its status as last written."""

    phase: Phase
    """status.phase."""
    restarts_by_cause: dict[str, int] = field(default_factory=dict)
    """status.restarts.byCause (persisted in the job, so it survives an operator restart)."""
    replicas: int | None = None
    """status.replicas: the gang's size in force (an elastic job's moves)."""
    stage: Stage | None = None
    """status.stage: the ZeRO stage in force (stage auto's choice moves on a re-plan)."""
    goodput: GoodputStatus | None = None
    """status.goodput: the ledger, read through the scrape's time (its `live` seconds)."""


class JobCollector(Collector):
    """Per-job series, built at scrape time from the jobs the operator holds: a deleted job's series vanish with it.

    Labels `namespace` and `zerotrain_job` name the job (the chart's ServiceMonitor honours them, as
    kube-state-metrics' does, so they are not renamed to the operator pod's namespace).
    """

    def __init__(self, jobs: dict[JobKey, JobView], lock: threading.Lock) -> None:
        self._jobs, self._lock = jobs, lock

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            jobs = dict(self._jobs)
        phase = GaugeMetricFamily(
            "zerotrain_operator_job_phase",
            "1 for the job's current phase, 0 for the others.",
            labels=["namespace", "zerotrain_job", "phase"],
        )
        restarts = CounterMetricFamily(
            "zerotrain_operator_job_restarts",
            "Gang restarts of the job by cause, from its status.",
            labels=["namespace", "zerotrain_job", "cause"],
        )
        replicas = GaugeMetricFamily(
            "zerotrain_operator_job_replicas",
            "Pods of the job's gang in force (an elastic job's size; the dashboard marks its changes).",
            labels=["namespace", "zerotrain_job"],
        )
        stage = GaugeMetricFamily(
            "zerotrain_operator_job_stage",
            "The ZeRO stage the job's ranks run (stage auto's choice; the dashboard marks its changes).",
            labels=["namespace", "zerotrain_job"],
        )
        spent = GaugeMetricFamily(
            "zerotrain_operator_job_goodput_seconds",
            "The job's wall time by goodput bucket (pending, starting, training, evaluating, checkpointing, lost, "
            "restarting), from its status.goodput through the scrape.",
            labels=["namespace", "zerotrain_job", "bucket"],
        )
        ratio = GaugeMetricFamily(
            "zerotrain_operator_job_goodput_ratio",
            "The job's training seconds over its wall time.",
            labels=["namespace", "zerotrain_job"],
        )
        now = datetime.now(timezone.utc)
        for (ns, name), view in sorted(jobs.items()):
            if view.goodput is not None:
                live = view.goodput.live(now)
                for bucket in Bucket:
                    spent.add_metric([ns, name, bucket.value], live.get(bucket))
                ratio.add_metric([ns, name], live.fractions().training)
            for p in Phase:
                phase.add_metric([ns, name, p.value], float(p is view.phase))
            for cause, count in sorted(view.restarts_by_cause.items()):
                restarts.add_metric([ns, name, cause], count)
            if view.replicas is not None:
                replicas.add_metric([ns, name], view.replicas)
            if view.stage is not None:
                stage.add_metric([ns, name], int(view.stage))
        yield phase
        yield restarts
        yield replicas
        yield stage
        yield spent
        yield ratio


class OperatorMetrics:
    """Reconcile count and duration by result, jobs by phase, gang restarts by reason; per job: phase, restarts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "zerotrain_operator_reconcile", "Reconcile passes by result.", ["result"], registry=self.registry
        )
        self.duration = Histogram(
            "zerotrain_operator_reconcile_duration_seconds",
            "Duration of one reconcile pass by result.",
            ["result"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.jobs = Gauge("zerotrain_operator_jobs", "Jobs by phase.", ["phase"], registry=self.registry)
        self.restarts = Counter(
            "zerotrain_operator_gang_restarts", "Gang restarts by reason.", ["reason"], registry=self.registry
        )
        self.resizes = Counter(
            "zerotrain_operator_resizes",
            "Elastic gang resizes by cause (Unschedulable, CapacityReturned) and direction (shrink, grow).",
            ["cause", "direction"],
            registry=self.registry,
        )
        self.replans = Counter(
            "zerotrain_operator_replans",
            "Re-plans of a job's stage by cause (OutOfMemory; Resized when stage auto chose another stage at a "
            "new size).",
            ["cause"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "zerotrain_operator_api_requests",
            "Requests the operator's own client sent to the API server (kopf's watches and patches not included), by "
            "HTTP verb, resource and status code (0: no answer).",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.api_throttled = Counter(
            "zerotrain_operator_api_throttled_seconds",
            "Seconds requests waited for the operator's own client-side rate limit (ZEROTRAIN_API_QPS, _API_BURST).",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "zerotrain_operator_work_queue_depth",
            "Jobs whose pass waits for a worker (the delayed ones, due later, not counted).",
            registry=self.registry,
        )
        self.queue_retries = Counter(
            "zerotrain_operator_work_queue_retries",
            "Passes that could not act (one raised, or a write was refused) and were queued again after their job's "
            "back-off.",
            registry=self.registry,
        )
        self._jobs: dict[JobKey, JobView] = {}
        self._lock = threading.Lock()
        self.registry.register(JobCollector(self._jobs, self._lock))
        self._server: Any = None
        for phase in Phase:
            self.jobs.labels(phase=phase.value).set(0)

    def observe_reconcile(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result=result).inc()
        self.duration.labels(result=result).observe(seconds)

    def set_job(self, key: JobKey, view: JobView | None) -> None:
        """Record a job's phase and restarts (None: the job is gone, its series go) and refresh the phase counts."""
        with self._lock:
            if view is None:
                self._jobs.pop(key, None)
            else:
                self._jobs[key] = view
            for p in Phase:
                self.jobs.labels(phase=p.value).set(sum(1 for v in self._jobs.values() if v.phase == p))

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop its series."""
        self.set_job(key, None)

    def api_request(self, verb: str, resource: str, code: int, throttled_seconds: float) -> None:
        """kube.RequestObserver: one request answered (or not: code 0), after `throttled_seconds` of client-side
        rate limiting."""
        self.api_requests.labels(verb=verb, resource=resource, code=str(code)).inc()
        if throttled_seconds > 0:
            self.api_throttled.inc(throttled_seconds)

    def gang_restarted(self, reason: str) -> None:
        self.restarts.labels(reason=reason).inc()

    def resized(self, record: Resize) -> None:
        direction = "grow" if record.to_replicas > record.from_replicas else "shrink"
        self.resizes.labels(cause=record.cause.value, direction=direction).inc()

    def replanned(self, cause: str) -> None:
        self.replans.labels(cause=cause).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
