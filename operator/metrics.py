"""The operator's Prometheus metrics, in their own registry (so tests and several operators don't collide)."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from zerotrain.job_status import Phase


class OperatorMetrics:
    """Reconcile count and duration by result, jobs by phase, gang restarts by reason."""

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
        self._phases: dict[tuple[str, str], Phase] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        for phase in Phase:
            self.jobs.labels(phase=phase.value).set(0)

    def observe_reconcile(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result=result).inc()
        self.duration.labels(result=result).observe(seconds)

    def set_phase(self, key: tuple[str, str], phase: Phase | None) -> None:
        """Record a job's phase (None: the job is gone) and refresh the per-phase gauge."""
        with self._lock:
            if phase is None:
                self._phases.pop(key, None)
            else:
                self._phases[key] = phase
            for p in Phase:
                self.jobs.labels(phase=p.value).set(sum(1 for v in self._phases.values() if v == p))

    def gang_restarted(self, reason: str) -> None:
        self.restarts.labels(reason=reason).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
