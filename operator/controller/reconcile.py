"""One idempotent reconcile of one job: read → admit → observe → decide (pure) → act → write status once.

Job and pod events, the resync and the passes' own wake-ups only add the job's key to one work queue
(`Reconciler.ask`); a fixed set of workers runs the passes. The queue never runs two passes of a job at once and
queues a job once however often it is asked for, so a burst of pod events costs one or two passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.children import builders, kueue
from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.cached_client import CachedClient
from zerotrain.operator.client.events import EventQueue, EventRecorder
from zerotrain.operator.client.fair_pool import FairPool
from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.operator.client.work_queue import WorkQueue
from zerotrain.operator.controller import resize
from zerotrain.operator.controller.act import ChildWriter
from zerotrain.operator.controller.admission import Admission, admit
from zerotrain.operator.controller.conditions import Reason
from zerotrain.operator.controller.job_events import transitions
from zerotrain.operator.controller.observe import observe_pods, timestamp
from zerotrain.operator.controller.pass_facts import PassFacts, settle
from zerotrain.operator.controller.status import Backoff, Decision, compute_status, invalid
from zerotrain.operator.controller.status_write import read_status, status_ops, status_patch
from zerotrain.operator.metrics import JobView, OperatorMetrics
from zerotrain.operator.objects import Key
from zerotrain.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


class Result(str, Enum):
    """How a reconcile pass ended (the metrics' `result` label)."""

    OK = "ok"
    INVALID = "invalid"
    GONE = "gone"
    ERROR = "error"


@dataclass(frozen=True)
class PassOutcome:
    """How one reconcile pass ended (not a launch's `runtime.launch.Outcome`): its result, why, and when to look
    again."""

    result: Result
    message: str = ""
    requeue_after: float | None = None
    retry: bool = False
    """The pass could not act (a child write refused, the Kueue queue missing): look again after the job's
    back-off."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Reconciler:
    """Reconciles jobs against one API server: every pass is asked for through `ask` and run by one of
    `settings.reconcile_workers` workers taking job keys from one work queue."""

    kube: Kube
    settings: OperatorSettings
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    clock: Callable[[], datetime] = utcnow
    cache: ObjectCache = field(default_factory=ObjectCache)
    """Jobs and children as the watch streams last showed them (the operator process's watches feed it; a test that
    drives passes alone seeds it, or lets the first pass read from the server)."""
    _mu: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False
    _workers: list[threading.Thread] = field(default_factory=list)
    _applied_for: dict[Key, str] = field(default_factory=dict)
    """The uid of each job whose supporting children this process has applied."""
    events: EventQueue = field(init=False)
    """Every Event the passes post: queued, then correlated and sent by one thread, as client-go's recorder does."""
    queue: WorkQueue[Key] = field(init=False)
    """The keys of the jobs a pass is wanted for, and each job's one back-off."""

    _creates: FairPool = field(init=False)
    writer: ChildWriter = field(init=False)
    """The pass's child writes, on `_creates` (shared by every job, taken in turn)."""
    client: CachedClient = field(init=False)
    """The pass's reads and writes, through `cache` where there is one."""

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self._retry_delay)
        self.client = CachedClient(self.kube, self.cache)
        self.events = EventQueue(EventRecorder(self.kube))
        self._creates = FairPool(self.settings.pod_create_concurrency)
        self.writer = ChildWriter(self.kube, self.client, self._creates, self.settings.max_pod_creates_per_pass)
        self.metrics.queue_depth.set_function(lambda: len(self.queue))

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.settings.restart_backoff_seconds, self.settings.max_restart_backoff_seconds)

    def _retry_delay(self, failures: int) -> float:
        """The one back-off of a job whose passes could not do their work (one raised, or was held back), growing
        with each consecutive such pass; never past the resync period, whose pass comes anyway."""
        return min(max(self.backoff.delay(failures), 0.05), self.settings.resync_seconds)

    def ask(self, job: Key) -> None:
        """A pass is wanted (a watch event of any kind, a resync): the job's key joins the work queue, where it is
        queued once however often it is asked for; the caller never waits."""
        self._start()
        self.queue.add(job)

    def _start(self) -> None:
        with self._mu:
            if self._workers or self._closed:
                return
            for i in range(self.settings.reconcile_workers):
                t = threading.Thread(target=self._work, name=f"zerotrain-worker-{i}", daemon=True)
                t.start()
                self._workers.append(t)

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._serve(key)
            finally:
                self.queue.done(key)

    def _serve(self, key: Key) -> None:
        """One pass of `key`, and when to look again: after the job's back-off if it could not act, at the time the
        decision asked for, else at the next event or resync."""
        try:
            outcome = self.reconcile(*key)
        except Exception:
            log.exception("reconcile of %s/%s failed", *key)
            outcome = PassOutcome(Result.ERROR, retry=True)
        if outcome.retry:
            self.metrics.queue_retries.inc()
            self.queue.add_rate_limited(key)
            return
        self.queue.forget(key)
        if outcome.requeue_after is not None and outcome.requeue_after < self.settings.resync_seconds:
            self.queue.add_after(key, outcome.requeue_after)

    def reconcile(self, namespace: str, name: str) -> PassOutcome:
        """One pass of the job on the caller's thread: the workers' way in (the queue never hands a key to two of
        them at once)."""
        return self._timed((namespace, name))

    def close(self, wait_seconds: float = 10.0) -> None:
        """Stop: no pass starts from now on, and those running get `wait_seconds` to end, so a standby that takes
        the Lease after this returns does not reconcile a job beside one of them."""
        with self._mu:
            self._closed = True
        self.queue.shut_down()
        deadline = time.monotonic() + wait_seconds
        for t in self._workers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._creates.close()
        self.events.close()

    def _timed(self, key: Key) -> PassOutcome:
        start = time.perf_counter()
        try:
            outcome = self._once(*key)
        except Exception:
            self.metrics.observe_reconcile(Result.ERROR.value, time.perf_counter() - start)
            raise
        self.metrics.observe_reconcile(outcome.result.value, time.perf_counter() - start)
        return outcome

    def _once(self, namespace: str, name: str) -> PassOutcome:
        """Read → admit → decide (pure) → write the children → settle the status (pure) → one status patch."""
        body = self.client.job(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self.metrics.forget((namespace, name))
            self._applied_for.pop((namespace, name), None)
            return PassOutcome(Result.GONE)  # children go with the job through their owner references
        previous, now = read_status(body), self.clock()
        verdict = self._admit(body, previous)
        job = builders.JobRef.from_body(body)
        if (refusal := self._refusal(job, verdict)) is not None:
            new = invalid(previous, *refusal, now)
            new.memory_plan = verdict.plan
            self._write(body, previous, new)
            return PassOutcome(Result.INVALID, refusal[1])
        assert verdict.spec is not None and verdict.sized is not None
        decision = self._decide(body, job, verdict, previous, now)
        acted = self.writer.act(
            job, verdict.spec, verdict.sized, decision, self._supporting(job, body, previous, decision)
        )
        if decision.delete_job and not acted.held_back:
            # The job is being deleted (no finalizer holds it): a status write now would only meet a 404.
            self.metrics.forget((namespace, name))
            return PassOutcome(Result.GONE)
        settled = settle(previous, decision.status, decision.requeue_after, acted, now)
        self._write(body, previous, settled.status)
        if acted.refused is not None:
            log.warning("%s/%s: %s", namespace, name, acted.refused)
            self.client.refused((namespace, name))
            return PassOutcome(Result.ERROR, str(acted.refused), retry=True)
        if acted.queue_missing is not None:
            return PassOutcome(Result.OK, acted.queue_missing[1], retry=True)
        self._applied_for[(namespace, name)] = job.uid
        self._count(previous, decision)
        return PassOutcome(Result.OK, requeue_after=settled.requeue_after)

    def _supporting(
        self, job: builders.JobRef, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, d: Decision
    ) -> bool:
        """Whether this pass applies the Service, ConfigMap and RBAC: before every gang starts, when the spec changed,
        and on the first pass of the job in this process (an upgraded operator's builders may set other fields,
        and an apply removes those it no longer sets); not on the many pod events in between."""
        changed = previous is None or previous.observed_generation != body["metadata"].get("generation")
        return d.create_gang or changed or self._applied_for.get((job.namespace, job.name)) != job.uid

    def _refusal(self, job: builders.JobRef, verdict: Admission) -> tuple[str, str] | None:
        """(reason, message) when the job is not admitted as it stands."""
        if not verdict.admitted or verdict.spec is None or verdict.sized is None:
            return verdict.reason or "", verdict.message
        if job.queue and verdict.spec.elastic is not None:
            return Reason.ELASTIC_IN_QUEUE, (
                f"spec.elastic: the job is in Kueue queue {job.queue!r} (label {kueue.QUEUE_LABEL}), which admits a "
                "fixed number of pods, so the gang could not resize; drop spec.elastic or the queue label"
            )
        return None

    def _decide(
        self,
        body: dict[str, Any],
        job: builders.JobRef,
        verdict: Admission,
        previous: ZeroTrainingJobStatus | None,
        now: datetime,
    ) -> Decision:
        """compute_status with everything admission decided and the pods as the cache holds them."""
        assert verdict.spec is not None and verdict.sized is not None
        recompute = recomputing(previous)
        chose = None
        if verdict.stage_choice is not None:
            chose = verdict.stage_choice.message
            if recompute:
                chose += "; activation checkpointing on since stage 3 ran out of memory"
        generation = body["metadata"].get("generation")
        created = timestamp(body["metadata"].get("creationTimestamp"))
        facts = PassFacts(verdict.spec.zero.fixed_stage, verdict.plan, chose, generation, job.queue, created)
        return compute_status(
            verdict.sized,
            observe_pods(self.client.pods(job.namespace, job.name)),
            previous,
            now,
            self.backoff,
            replan=verdict.stage_choice is not None,
            sizing=self._sizing(body, verdict, previous),
            facts=facts,
        )

    def _count(self, previous: ZeroTrainingJobStatus | None, decision: Decision) -> None:
        """The operator's counters for what a pass that acted did."""
        if decision.restart_cause:
            self.metrics.gang_restarted(decision.restart_cause)
        if decision.resize is not None:
            self.metrics.resized(decision.resize)
        if (cause := replan_cause(previous, decision)) is not None:
            self.metrics.replanned(cause)
        elif decision.status.activation_checkpointing and not recomputing(previous):
            self.metrics.replanned(Reason.OUT_OF_MEMORY)

    def relist_jobs(self, namespaces: list[str]) -> None:
        """CachedClient.relist_jobs, forgetting the series of jobs found gone."""
        for key in self.client.relist_jobs(namespaces):
            self.metrics.forget(key)

    def _admit(
        self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, replicas: int | None = None
    ) -> Admission:
        """Admission at the size the gang runs (or `replicas`), above the stage floor an out-of-memory left."""
        s = self.settings
        floor = previous.stage_floor if previous is not None else None
        size = replicas if replicas is not None else (previous.replicas if previous is not None else None)
        name = body["metadata"]["name"]
        return admit(body.get("spec"), name, s.gpu_memory, s.allow_host_path, floor, size, recomputing(previous))

    def _sizing(
        self, body: dict[str, Any], verdict: Admission, previous: ZeroTrainingJobStatus | None
    ) -> resize.Sizing | None:
        """What resizes may move to, for an elastic job: each size checked by admission at that size."""
        spec = verdict.spec
        if spec is None or spec.elastic is None:
            return None

        def check(replicas: int) -> resize.SizeVerdict:
            at = self._admit(body, previous, replicas)
            stage = at.spec.zero.fixed_stage if at.admitted and at.spec is not None else None
            return resize.SizeVerdict(at.admitted, stage, at.message, at.plan)

        return resize.Sizing(spec.elastic, spec, check)

    def _patch_status(self, md: dict[str, Any], held: object, patch: dict[str, Any]) -> None:
        """Write `patch` onto the status `held` (as this pass read it). Refused (409/422) for the job this pass read,
        the ops are built again against the status the server holds and sent once more: its first attempt may have
        been applied with the answer lost (a `remove` then finds nothing to remove), or the cache's copy was behind.
        A job gone, or another of its name in its place (the uid test failed), is a 404."""
        ns, name, uid = md["namespace"], md["name"], md.get("uid")
        try:
            self.client.patch_job_status(ns, name, status_ops(uid, held, patch))
        except KubeError as e:
            if e.status not in (409, 422):
                raise
            now = self.kube.get_job(ns, name)
            if now is None or (now.get("metadata") or {}).get("uid") != uid:
                raise KubeError(404, "NotFound", f"{ns}/{name} was deleted while the pass ran", "PATCH") from e
            self.client.patch_job_status(ns, name, status_ops(uid, now.get("status"), patch))

    def _write(self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus) -> None:
        md = body["metadata"]
        key = (md["namespace"], md["name"])
        view = JobView(new.phase, dict(new.restarts.by_cause), new.replicas, new.stage, new.goodput)
        self.metrics.set_job(key, view)
        patch = status_patch(previous, new)
        if patch is None:
            return
        try:
            self._patch_status(md, body.get("status"), patch)
        except KubeError as e:
            if e.status != 404:
                raise
            # Deleted while this pass ran (its DELETED event may have forgotten it already): the series this pass
            # just set would otherwise outlive the job, and the cache's copy would keep a pass acting on it.
            self.metrics.forget(key)
            self.client.gone(body)
            return
        job, now = builders.JobRef.from_body(body), self.clock()
        for ev in transitions(previous, new):
            self.events.record(builders.build_event(job, ev.type, ev.reason, ev.message, now))


def recomputing(previous: ZeroTrainingJobStatus | None) -> bool:
    """Activation checkpointing is on for the job: stage 3 ran out of memory without it."""
    return bool(previous and previous.activation_checkpointing)


def replan_cause(previous: ZeroTrainingJobStatus | None, d: Decision) -> str | None:
    """Why the stage in force changed in this pass, if it did: stage auto moving past a stage that ran out of
    memory, choosing again at a new size, or the spec changed."""
    before, after = (previous.stage if previous else None), d.status.stage
    if before is None or after is None or before == after:
        return None
    if d.resize is not None:
        return resize.RESIZED
    return Reason.OUT_OF_MEMORY if previous and previous.stage_floor == after else "SpecChanged"
