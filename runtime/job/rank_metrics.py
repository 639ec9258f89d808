"""Every rank's Prometheus metrics: memory by category (measured and predicted), device memory, communication by
op, step, checkpoints, heartbeat and phase, served on /metrics from the rank's own registry.

Cost on the hot path: the training loop calls `observe_step` once per optimizer step with values it already
holds (the engine's memory report and collective counters, the step's loss and norm). Those are copied into an
immutable snapshot that scrapes read, so a scrape never takes a lock the training thread waits on, never adds a
device synchronisation and never issues a collective. `phase()` is an attribute write and one clock read.

Every series carries `zerotrain_job`, `rank`, `local_rank` and `stage`. In a cluster Prometheus adds the
target's `namespace` and `pod`; `job` belongs to Prometheus (its scrape job) and is never set here.
"""

from __future__ import annotations

import dataclasses
import errno
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zerotrain.runtime.job.device_memory import DeviceMemory, DeviceProbe
from zerotrain.runtime.job.metrics_endpoint import Endpoint, report_port
from zerotrain.runtime.job.metrics_sink import MetricsSink, NoMetrics, StepValues
from zerotrain.runtime.job.split_metrics import SplitMetrics
from zerotrain.runtime.job.step_split import StepSplit
from zerotrain.runtime.job.stragglers import Straggler
from zerotrain.runtime.rank_phase import RankPhase
from zerotrain.runtime.zero.memory import MemoryReport

if TYPE_CHECKING:
    from zerotrain.goodput import GoodputSeconds
    from zerotrain.runtime.zero.engine import ZeroEngine

# The loop's sink and what it hands over live in metrics_sink; the rank's readers import them here too.
__all__ = ["MEMORY_CATEGORIES", "STEP_BUCKETS", "MetricsSink", "NoMetrics", "RankMetrics", "Snapshot", "StepValues"]


# Step times from a fast CPU test model (tens of ms) to a large model's step (minutes).
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0)


# (category label, measured field, peak field or None, predicted field or None) of `MemoryReport`.
MEMORY_CATEGORIES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("parameters", "parameter_bytes", None, "predicted_parameter_bytes"),
    ("gradients", "gradient_bytes", None, "predicted_gradient_bytes"),
    ("optimizer_states", "optimizer_bytes", None, "predicted_optimizer_bytes"),
    ("host_optimizer_states", "host_optimizer_bytes", None, "predicted_host_optimizer_bytes"),
    ("host_parameters", "host_parameter_bytes", None, "predicted_host_parameter_bytes"),
    ("gathered_parameters", "gathered_bytes", "gathered_peak_bytes", "predicted_gathered_peak_bytes"),
    ("communication_buffers", "comm_buffer_bytes", "comm_buffer_peak_bytes", "predicted_comm_buffer_peak_bytes"),
    ("activations", "activation_bytes", "activation_peak_bytes", None),
    ("gradient_arenas", "gradient_arena_bytes", None, "predicted_gradient_arena_bytes"),
)


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reads: replaced whole, never mutated."""

    memory: MemoryReport | None = None
    comm: Mapping[str, tuple[int, int, int, float]] = field(default_factory=dict)
    comm_planned: Mapping[str, int] = field(default_factory=dict)
    """Bytes per optimizer step by op the plan predicts (`zerotrain.plan.peak.comm_bytes_per_step`)."""
    device: DeviceMemory | None = None
    step: StepValues | None = None
    grad_norm: float | None = None
    """The last gradient norm a step computed (logged steps, or every step when clipping or in fp16)."""
    steps_applied: int = 0
    steps_skipped: int = 0
    tokens: int = 0
    saves: int = 0
    save_seconds: float = 0.0
    save_bytes: int = 0
    last_save_seconds: float = 0.0
    blocked_seconds: float = 0.0
    """Seconds saves held the step loop (all of a synchronous save; an asynchronous one's snapshot)."""
    last_blocked_seconds: float | None = None
    last_committed_step: int | None = None
    load_seconds: float | None = None
    load_bytes: int | None = None
    eval_loss: float | None = None
    """The last evaluation's loss (mean over every rank's evaluation micro-batches)."""
    eval_step: int | None = None
    """The step that evaluation followed."""


class _Families:
    """Builds metric families that all carry the rank's constant labels."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.names, self.values = list(labels), list(labels.values())

    def gauge(self, name: str, doc: str, value: float | None, **extra: str) -> Metric:
        fam = GaugeMetricFamily(name, doc, labels=[*self.names, *extra])
        if value is not None:
            fam.add_metric([*self.values, *extra.values()], value)
        return fam

    def by(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        doc: str,
        key: str,
        values: Mapping[str, float],
    ) -> Metric:
        fam = kind(name, doc, labels=[*self.names, key])
        for k, v in values.items():
            fam.add_metric([*self.values, k], v)
        return fam

    def counter(self, name: str, doc: str, value: float) -> Metric:
        fam = CounterMetricFamily(name, doc, labels=self.names)
        fam.add_metric(self.values, value)
        return fam


class SnapshotCollector(Collector):
    """Turns the current `Snapshot` (and phase and heartbeat) into metric families at scrape time."""

    def __init__(self, owner: RankMetrics) -> None:
        self.owner = owner
        self.f = _Families(owner.labels)

    def collect(self) -> Iterator[Metric]:
        o, f = self.owner, self.f
        s = o.snapshot  # one read: the training thread replaces it whole
        yield f.gauge("zerotrain_world_size", "Ranks in the job.", o.world_size)
        yield f.gauge("zerotrain_heartbeat_timestamp_seconds", "Last time the rank made progress (Unix).", o.heartbeat)
        yield f.by(
            GaugeMetricFamily,
            "zerotrain_phase",
            "The rank's current phase (1) among all phases (0).",
            "phase",
            {p.value: float(p is o.current_phase) for p in RankPhase},
        )
        yield from self._memory(s)
        yield from self._device(s)
        yield from self._comm(s)
        yield from self._step(s)
        yield from self._checkpoint(s)

    def _memory(self, s: Snapshot) -> Iterator[Metric]:
        m = s.memory
        if m is None:
            return
        yield self.f.by(
            GaugeMetricFamily,
            "zerotrain_memory_bytes",
            "Bytes this rank holds now by category, measured from live tensors.",
            "category",
            {c: getattr(m, measured) for c, measured, _, _ in MEMORY_CATEGORIES},
        )
        yield self.f.by(
            GaugeMetricFamily,
            "zerotrain_memory_peak_bytes",
            "Most bytes held at once by category since the rank started.",
            "category",
            {c: getattr(m, peak) for c, _, peak, _ in MEMORY_CATEGORIES if peak},
        )
        yield self.f.by(
            GaugeMetricFamily,
            "zerotrain_memory_predicted_bytes",
            "Bytes by category the ZeRO formula predicts for this rank.",
            "category",
            {c: getattr(m, pred) for c, _, _, pred in MEMORY_CATEGORIES if pred},
        )

    def _device(self, s: Snapshot) -> Iterator[Metric]:
        d = s.device
        if d is None:
            return
        yield self.f.gauge(
            "zerotrain_device_memory_used_bytes",
            "Device memory in use (CUDA: reserved by the allocator; CPU: resident set).",
            d.used_bytes,
            device=d.device,
        )
        yield self.f.gauge(
            "zerotrain_device_memory_limit_bytes",
            "Device memory available (CUDA: total; CPU: container limit, else host memory).",
            d.limit_bytes,
            device=d.device,
        )
        yield self.f.gauge("zerotrain_process_resident_memory_bytes", "Resident set size of the rank.", d.rss_bytes)
        if d.cuda:
            for key in ("allocated", "reserved", "peak_allocated"):
                yield self.f.gauge(
                    f"zerotrain_cuda_memory_{key}_bytes",
                    f"CUDA caching allocator: {key} bytes.",
                    d.cuda[key],
                    device=d.device,
                )
            fam = CounterMetricFamily(
                "zerotrain_cuda_alloc_retries",
                "CUDA allocations retried after freeing the cache (fragmentation or memory pressure).",
                labels=[*self.f.names, "device"],
            )
            fam.add_metric([*self.f.values, d.device], d.cuda["alloc_retries"])
            yield fam

    def _comm(self, s: Snapshot) -> Iterator[Metric]:
        for i, (name, doc) in enumerate(
            (
                ("zerotrain_comm_calls", "Collective calls by op."),
                ("zerotrain_comm_bytes", "Bytes sent by op (ring convention: what each rank sends)."),
                ("zerotrain_comm_payload_bytes", "Tensor bytes handed to collectives by op."),
                ("zerotrain_comm_seconds", "Seconds the rank spent in (or waiting for) collectives by op."),
            )
        ):
            yield self.f.by(CounterMetricFamily, name, doc, "op", {op: v[i] for op, v in s.comm.items()})
        if s.comm_planned:
            yield self.f.by(
                GaugeMetricFamily,
                "zerotrain_comm_planned_bytes_per_step",
                "Bytes per optimizer step by op the plan predicts this rank sends (ring convention).",
                "op",
                dict(s.comm_planned),
            )

    def _step(self, s: Snapshot) -> Iterator[Metric]:
        f, st = self.f, s.step
        yield f.counter("zerotrain_optimizer_steps", "Optimizer steps applied.", s.steps_applied)
        yield f.counter("zerotrain_skipped_steps", "Steps skipped on fp16 gradient overflow.", s.steps_skipped)
        yield f.counter("zerotrain_tokens", "Tokens this rank processed.", s.tokens)
        yield f.gauge("zerotrain_training_steps", "Optimizer steps the job trains for.", self.owner.total_steps)
        yield f.gauge(
            "zerotrain_eval_loss", "Loss of the last evaluation (mean over every rank's micro-batches).", s.eval_loss
        )
        yield f.gauge("zerotrain_eval_step", "The step the last evaluation followed.", s.eval_step)
        if st is None:
            return
        yield f.gauge("zerotrain_step", "The last finished step.", st.step)
        yield f.gauge(
            "zerotrain_tokens_per_second",
            "This rank's tokens per second over the last step.",
            st.tokens / st.seconds if st.seconds > 0 else 0.0,
        )
        yield f.gauge("zerotrain_loss", "Loss of the last step (mean over the global batch).", st.loss)
        yield f.gauge("zerotrain_grad_norm", "Global gradient norm of the last step that computed it.", s.grad_norm)
        yield f.gauge("zerotrain_learning_rate", "Learning rate the last step trained at.", st.learning_rate)
        yield f.gauge("zerotrain_loss_scale", "fp16 loss scale of the last step (1 otherwise).", st.loss_scale)

    def _checkpoint(self, s: Snapshot) -> Iterator[Metric]:
        f = self.f
        yield f.counter("zerotrain_checkpoint_saves", "Checkpoints this rank saved and committed.", s.saves)
        yield f.counter("zerotrain_checkpoint_save_seconds", "Seconds spent saving checkpoints.", s.save_seconds)
        yield f.counter("zerotrain_checkpoint_save_bytes", "Bytes this rank wrote to checkpoints.", s.save_bytes)
        yield f.gauge(
            "zerotrain_checkpoint_last_save_duration_seconds",
            "Duration of the last save, from its start to its commit.",
            s.last_save_seconds if s.saves else None,
        )
        yield f.counter(
            "zerotrain_checkpoint_blocked_seconds",
            "Seconds saves held the step loop (with checkpoint.async, only the snapshot into host memory).",
            s.blocked_seconds,
        )
        yield f.gauge(
            "zerotrain_checkpoint_last_save_blocked_seconds",
            "Seconds the last save held the step loop.",
            s.last_blocked_seconds,
        )
        yield f.gauge(
            "zerotrain_checkpoint_last_committed_step",
            "Step of the newest committed checkpoint.",
            s.last_committed_step,
        )
        yield f.gauge(
            "zerotrain_checkpoint_load_duration_seconds", "Duration of the load this run resumed from.", s.load_seconds
        )
        yield f.gauge("zerotrain_checkpoint_load_bytes", "Bytes this rank read to resume.", s.load_bytes)


class RankMetrics:
    """One rank's metrics: its registry, its /metrics server and the values the training loop hands it."""

    def __init__(
        self, job: str, rank: int, local_rank: int, world_size: int, stage: int, total_steps: int, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.labels = {"zerotrain_job": job, "rank": str(rank), "local_rank": str(local_rank), "stage": str(stage)}
        self.world_size, self.total_steps = world_size, total_steps
        self.snapshot = Snapshot()
        self.current_phase = RankPhase.STARTING
        self.heartbeat = time.time()
        self.registry = CollectorRegistry()
        self.registry.register(SnapshotCollector(self))
        self.split = SplitMetrics(self.labels, rank)
        """The step split by phase and this rank's straggler verdict (`split_metrics`)."""
        self.registry.register(self.split)
        self.step_seconds = Histogram(
            "zerotrain_step_duration_seconds",
            "Wall time of one optimizer step (all micro-batches, the update, any checkpoint).",
            list(self.labels),
            registry=self.registry,
            buckets=STEP_BUCKETS,
        ).labels(**self.labels)
        self.probe: DeviceProbe | None = None
        self._server: Any = None
        self.address: tuple[str, int] | None = None

    def serve(self, endpoint: Endpoint) -> int:
        """Serve /metrics from a daemon thread on the endpoint's first free port, and return it. In a pod the one
        declared port must be free (a configuration error otherwise); a local run searches on."""
        from zerotrain.runtime.job.task import ConfigError

        local = self.labels["local_rank"]
        for port in endpoint.candidates():
            try:
                self._server, _ = start_http_server(port, addr=endpoint.addr, registry=self.registry)
            except OSError as e:
                if e.errno == errno.EADDRINUSE and endpoint.searches():
                    continue
                raise ConfigError(
                    f"{endpoint.setting}: port {port} (local rank {local}) cannot be served on {endpoint.addr}: "
                    f"{e.strerror or e}; another process uses it: set {endpoint.setting} to a free range of ports "
                    "(local rank r serves on port + r), or turn metrics off (spec.metrics.enabled: false; "
                    "`zerotrain run --no-metrics`)"
                ) from None
            port = int(self._server.server_port)
            self.address = (endpoint.addr, port)
            report_port(endpoint, int(self.labels["rank"]), port)
            return port
        raise ConfigError(
            f"{endpoint.setting}: got {endpoint.first - int(local)}; every port local rank {local} may use from there "
            f"up to 65535 is taken on {endpoint.addr}; pass a lower one, --metrics-port 0 (any free ports) or "
            "--no-metrics"
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def phase(self, phase: RankPhase) -> None:
        """Enter `phase`; also a heartbeat."""
        self.current_phase = phase
        self.heartbeat = time.time()

    def observe_step(self, engine: ZeroEngine, values: StepValues) -> None:
        """Once per optimizer step, from what the engine and the loop already hold: no sync, no collective."""
        if not self.enabled:
            return
        if self.probe is None:
            self.probe = DeviceProbe(engine.device)
        s = self.snapshot
        engine.comm.stats.settle()
        comm = {op: (o.calls, o.bytes, o.payload_bytes, o.seconds) for op, o in engine.comm.stats.ops.items()}
        self.snapshot = dataclasses.replace(
            s,
            memory=engine.accounting().memory_report(),
            comm=comm,
            comm_planned=s.comm_planned or engine.accounting().planned_comm(),
            device=self.probe.read(),
            step=values,
            grad_norm=values.grad_norm if values.grad_norm is not None else s.grad_norm,
            steps_applied=s.steps_applied + int(values.applied),
            steps_skipped=s.steps_skipped + int(values.skipped),
            tokens=s.tokens + values.tokens,
        )
        self.step_seconds.observe(values.seconds)
        self.heartbeat = time.time()

    def observe_split(self, split: StepSplit, run: GoodputSeconds) -> None:
        self.split.observe_split(split, run)

    def observe_stragglers(self, named: list[Straggler]) -> None:
        self.split.observe_stragglers(named)

    def observe_save(self, step: int, seconds: float, nbytes: int) -> None:
        s = self.snapshot
        self.snapshot = dataclasses.replace(
            s,
            saves=s.saves + 1,
            save_seconds=s.save_seconds + seconds,
            save_bytes=s.save_bytes + nbytes,
            last_save_seconds=seconds,
            last_committed_step=step,
        )

    def observe_evaluation(self, step: int, loss: float) -> None:
        self.snapshot = dataclasses.replace(self.snapshot, eval_loss=loss, eval_step=step)

    def observe_blocked(self, seconds: float) -> None:
        """A save held the step loop this long (for an asynchronous one, the snapshot)."""
        s = self.snapshot
        self.snapshot = dataclasses.replace(
            s, blocked_seconds=s.blocked_seconds + seconds, last_blocked_seconds=seconds
        )

    def observe_load(self, step: int, seconds: float, nbytes: int) -> None:
        s = self.snapshot
        self.snapshot = dataclasses.replace(s, load_seconds=seconds, load_bytes=nbytes, last_committed_step=step)
