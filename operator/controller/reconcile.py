"""One idempotent reconcile of one job: read → admit → observe → decide (pure) → act → write status once.

Job and pod events ask for passes (`Reconciler.ask`), the resync timer and back-off wake-ups run them
(`Reconciler.reconcile`); passes of the same job are coalesced (never concurrent), so a burst of pod events costs
one or two passes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pydantic import ValidationError

from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.operator.children import builders, kueue, naming
from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.cached_client import CachedClient
from zerotrain.operator.client.events import EventRecorder
from zerotrain.operator.client.fair_pool import FairPool
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.operator.controller import api_failure, resize
from zerotrain.operator.controller.admission import Admission, admit
from zerotrain.operator.controller.api_failure import ChildWriteError
from zerotrain.operator.controller.conditions import ConditionType, Reason, is_true, set_condition
from zerotrain.operator.controller.observe import observe_pods
from zerotrain.operator.controller.pass_facts import PassFacts
from zerotrain.operator.controller.status import (
    TERMINAL,
    Backoff,
    Decision,
    compute_status,
    gang_created_message,
    invalid,
    transitions,
)
from zerotrain.operator.metrics import JobView, OperatorMetrics
from zerotrain.operator.objects import Key
from zerotrain.operator.settings import OperatorSettings
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

log = logging.getLogger(__name__)
# Status fields written by the runtime's rank 0 (runtime.status_report), never by the operator.
RUNTIME_OWNED = ("step", "lastCheckpoint", "lastEvaluation")


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


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def read_status(body: dict[str, Any]) -> ZeroTrainingJobStatus | None:
    """The job's status as last written, ignoring fields others keep there (kopf's progress)."""
    raw = body.get("status") or {}
    known = {f.alias or n for n, f in ZeroTrainingJobStatus.model_fields.items()}
    try:
        return ZeroTrainingJobStatus.model_validate({k: v for k, v in raw.items() if k in known}) if raw else None
    except ValidationError:
        log.warning("status of %s is unreadable; rebuilding it", body.get("metadata", {}).get("name"))
        return None


def status_patch(previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus) -> dict[str, Any] | None:
    """The merge patch from previous to new status, or None when nothing changed."""
    before = {k: v for k, v in (previous.to_wire() if previous else {}).items() if k not in RUNTIME_OWNED}
    after = {k: v for k, v in new.to_wire().items() if k not in RUNTIME_OWNED}
    if before == after:
        return None
    return {**{k: None for k in before if k not in after}, **after}


def status_ops(uid: str | None, held: object, patch: dict[str, Any]) -> list[dict[str, Any]]:
    """`patch` (status_patch's) as a JSON patch onto `held`, the status the pass read, applied only to the job the
    pass read: its first op tests the uid, so a job deleted and created again under the same name meanwhile is
    refused (422) instead of taking the old one's status. (A uid in a merge patch is no such precondition on a
    status subresource: the server keeps the stored metadata, whatever the patch says.) The runtime's fields are
    left as they are, except on the first write, which sets the whole status before any rank has run."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
    if not isinstance(held, dict):  # no status yet: a member of it cannot be added
        return [*ops, {"op": "add", "path": "/status", "value": {k: v for k, v in patch.items() if v is not None}}]
    for k, v in patch.items():
        path = "/status/" + k.replace("~", "~0").replace("/", "~1")
        if v is not None:
            ops.append({"op": "add", "path": path, "value": v})  # add replaces a member that exists
        elif k in held:
            ops.append({"op": "remove", "path": path})
    return ops


@dataclass
class _KeyState:
    running: bool = False
    dirty: bool = False
    timer: threading.Timer | None = None
    errors: int = 0
    """Consecutive passes that raised: the back-off of a handed-off pass's retry."""


@dataclass
class Reconciler:
    """Reconciles jobs against one API server."""

    kube: Kube
    settings: OperatorSettings
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    clock: Callable[[], datetime] = utcnow
    cache: ObjectCache | None = None
    """Jobs and pods as the watch streams last showed them (the operator process feeds one); without one, every
    pass reads the job and lists its pods from the server."""
    _states: dict[Key, _KeyState] = field(default_factory=dict)
    _failures: dict[Key, int] = field(default_factory=dict)
    """Consecutive passes whose child writes were refused, per job: the back-off of the retries."""
    _mu: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False
    _in_pass: int = 0
    """Passes running now, on any thread (close waits for them)."""
    events: EventRecorder = field(init=False)
    """Every Event the passes post, correlated as client-go's recorder does."""

    _creates: FairPool = field(init=False)
    client: CachedClient = field(init=False)
    """The pass's reads and writes, through `cache` where there is one."""
    _reruns: concurrent.futures.ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._reruns = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="zerotrain-rerun")
        self.client = CachedClient(self.kube, self.cache)
        self.events = EventRecorder(self.kube)
        self._creates = FairPool(self.settings.pod_create_concurrency)

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.settings.restart_backoff_seconds, self.settings.max_restart_backoff_seconds)

    def reconcile(self, namespace: str, name: str, hand_off: bool = False) -> PassOutcome | None:
        """Run a pass, or, if one is running for this job, make it run once more and return None.

        With `hand_off` the caller runs one pass and the passes asked for meanwhile run on the operator's own
        threads (a caller that must not loop while a gang starts: the reruns, so busy jobs take turns)."""
        key = (namespace, name)
        with self._mu:
            st = self._states.setdefault(key, _KeyState())
            if st.running:
                st.dirty = True
                return None
            st.running = True
        return self._passes(key, st, hand_off)

    def ask(self, job: Key) -> None:
        """A pass is wanted (a pod event): it runs on the operator's threads, or once more after the one running;
        the caller never waits for it."""
        with self._mu:
            if self._closed:
                return
            st = self._states.setdefault(job, _KeyState())
            if st.running:
                st.dirty = True
                return
            st.running = True
            self._reruns.submit(self._rerun, job, st)

    def _passes(self, key: Key, st: _KeyState, hand_off: bool) -> PassOutcome:
        """Passes of the job until none was asked for during the last one (`st.running` is ours until then)."""
        while True:
            st.dirty = False
            with self._mu:
                self._in_pass += 1
            try:
                outcome = self._timed(key)
            except BaseException:
                with self._mu:
                    self._in_pass -= 1
                    st.running = False
                    st.errors += 1
                raise
            with self._mu:
                self._in_pass -= 1
                st.errors = 0
                if self._closed:  # shutting down: no pass more
                    st.running = False
                    break
                if st.dirty and hand_off:
                    # To the back of the rerun queue: a job whose events keep coming gets one pass per turn, so four
                    # busy jobs cannot hold every rerun thread while the others' passes wait.
                    self._reruns.submit(self._rerun, key, st)
                    return outcome
                if not st.dirty:
                    st.running = False
                    # Only the state this loop owns: a job re-created under the same name has a fresh one by now.
                    if outcome.result == Result.GONE and self._states.get(key) is st:
                        del self._states[key]
                        self._failures.pop(key, None)
                        if st.timer is not None:
                            st.timer.cancel()
                    break
        self._wake_later(key, outcome.requeue_after)
        return outcome

    def _rerun(self, key: Key, st: _KeyState) -> None:
        try:
            self._passes(key, st, hand_off=True)
        except Exception:
            log.exception("reconcile of %s/%s failed", *key)
            self._retry_later(key, st)

    def _retry_later(self, key: Key, st: _KeyState) -> None:
        """Nobody else retries a failed pass before the resync: look again with back-off (growing with each
        consecutive failure, at most half the resync period)."""
        self._wake_later(key, min(self.backoff.delay(st.errors), self.settings.resync_seconds / 2))

    def close(self, wait_seconds: float = 10.0) -> None:
        """Stop: no pass starts from now on, and those running get `wait_seconds` to end, so a standby that takes
        the Lease after this returns does not reconcile a job beside one of them."""
        with self._mu:
            self._closed = True
            for st in self._states.values():
                if st.timer is not None:
                    st.timer.cancel()
        self._reruns.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            with self._mu:
                if not self._in_pass:
                    break
            time.sleep(0.05)
        self._creates.close()

    def _wake_later(self, key: Key, delay: float | None) -> None:
        """Back-off expiry, TTL and startup timeouts need a pass at a known time, not at the next resync."""
        with self._mu:
            st = self._states.get(key)
            if st is None or self._closed:
                return
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None
            if delay is not None and delay < self.settings.resync_seconds:
                st.timer = threading.Timer(max(delay, 0.05), self._wake, args=key)
                st.timer.daemon = True
                st.timer.start()

    def _wake(self, namespace: str, name: str) -> None:
        try:
            self.reconcile(namespace, name)
        except Exception:
            log.exception("scheduled reconcile of %s/%s failed", namespace, name)
            with self._mu:
                st = self._states.get((namespace, name))
            if st is not None:
                self._retry_later((namespace, name), st)

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
        body = self.client.job(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self.metrics.forget((namespace, name))
            return PassOutcome(Result.GONE)  # children go with the job through their owner references
        previous = read_status(body)
        now = self.clock()
        floor = previous.stage_floor if previous is not None else None
        size = previous.replicas if previous is not None else None
        recompute = bool(previous and previous.activation_checkpointing)
        verdict = self._admit(body, floor, size, recompute)
        if not verdict.admitted or verdict.spec is None or verdict.sized is None:
            new = invalid(previous, verdict.reason or "", verdict.message, now)
            new.memory_plan = verdict.plan
            self._write(body, previous, new)
            return PassOutcome(Result.INVALID, verdict.message)
        job = builders.JobRef.from_body(body)
        if job.queue and verdict.spec.elastic is not None:
            message = (
                f"spec.elastic: the job is in Kueue queue {job.queue!r} (label {kueue.QUEUE_LABEL}), which admits a "
                "fixed number of pods, so the gang could not resize; drop spec.elastic or the queue label"
            )
            self._write(body, previous, invalid(previous, Reason.ELASTIC_IN_QUEUE, message, now))
            return PassOutcome(Result.INVALID, message)
        chose = None
        if verdict.stage_choice is not None:
            chose = verdict.stage_choice.message
            if recompute:
                chose += "; activation checkpointing on since stage 3 ran out of memory"
        generation = body["metadata"].get("generation")
        facts = PassFacts(verdict.spec.zero.fixed_stage, verdict.plan, chose, generation, job.queue)
        decision = compute_status(
            verdict.sized,
            observe_pods(self.client.pods(namespace, name)),
            previous,
            now,
            self.backoff,
            replan=verdict.stage_choice is not None,
            sizing=self._sizing(body, verdict, floor, recompute),
            facts=facts,
        )
        spec_changed = previous is None or previous.observed_generation != generation
        if decision.create_gang and job.queue and (missing := self._queue_missing(job)):
            return self._queue_unavailable(body, previous, missing, now)
        try:
            self._act(job, verdict.spec, verdict.sized, decision, decision.create_gang or spec_changed)
        except ChildWriteError as e:
            return self._write_failed(body, previous, e, now)
        self._failures.pop((namespace, name), None)
        api_failure.clear(decision.status, now)
        if decision.delete_job:
            # The job is being deleted (no finalizer holds it): a status write now would only meet a 404.
            self.metrics.forget((namespace, name))
            return PassOutcome(Result.GONE)
        self._write(body, previous, decision.status)
        if decision.restart_cause:
            self.metrics.gang_restarted(decision.restart_cause)
        if decision.resize is not None:
            self.metrics.resized(decision.resize)
        if (cause := replan_cause(previous, decision)) is not None:
            self.metrics.replanned(cause)
        elif decision.status.activation_checkpointing and not recompute:
            self.metrics.replanned(Reason.OUT_OF_MEMORY)
        return PassOutcome(Result.OK, requeue_after=decision.requeue_after)

    def relist(self, namespaces: list[str]) -> tuple[list[Key], list[Key]]:
        """CachedClient.relist, forgetting the series of jobs found gone."""
        present, gone = self.client.relist(namespaces)
        for key in gone:
            self.metrics.forget(key)
        return present, gone

    def _admit(
        self, body: dict[str, Any], floor: Stage | None, replicas: int | None, recompute: bool = False
    ) -> Admission:
        s = self.settings
        name = body["metadata"]["name"]
        return admit(body.get("spec"), name, s.gpu_memory, s.allow_host_path, floor, replicas, recompute)

    def _sizing(
        self, body: dict[str, Any], verdict: Admission, floor: Stage | None, recompute: bool
    ) -> resize.Sizing | None:
        """What resizes may move to, for an elastic job: each size checked by admission at that size."""
        spec = verdict.spec
        if spec is None or spec.elastic is None:
            return None

        def check(replicas: int) -> resize.SizeVerdict:
            at = self._admit(body, floor, replicas, recompute)
            stage = at.spec.zero.fixed_stage if at.admitted and at.spec is not None else None
            return resize.SizeVerdict(at.admitted, stage, at.message, at.plan)

        return resize.Sizing(spec.elastic, spec, check)

    def _queue_missing(self, job: builders.JobRef) -> tuple[str, str] | None:
        """(reason, message) when the job's Kueue LocalQueue (or Kueue itself) is missing, else None."""
        assert job.queue is not None
        path = path_of(kueue.API, "localqueues", job.namespace, job.queue)
        try:
            self.kube.request("GET", path)
            return None
        except KubeError as e:
            if e.status != 404:
                raise
        try:
            self.kube.request("GET", f"/apis/{kueue.API}")
            installed = True
        except KubeError:
            installed = False
        reason = Reason.LOCAL_QUEUE_NOT_FOUND if installed else Reason.KUEUE_NOT_INSTALLED
        return reason, kueue.missing_message(job.queue, job.namespace, installed)

    def _queue_unavailable(
        self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, missing: tuple[str, str], now: datetime
    ) -> PassOutcome:
        """No gang without its queue: say why, create nothing, look again with back-off."""
        new = (previous or ZeroTrainingJobStatus()).model_copy(deep=True)
        set_condition(new, ConditionType.QUEUE_UNAVAILABLE, True, missing[0], missing[1], now)
        delay = self._held_back(body, previous, new)
        return PassOutcome(Result.OK, missing[1], requeue_after=max(delay, 1.0))

    def _write_failed(
        self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, err: ChildWriteError, now: datetime
    ) -> PassOutcome:
        """A child write was refused: say so in status (one Event per new reason) and retry with back-off."""
        log.warning("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], err)
        self.client.refused((body["metadata"]["namespace"], body["metadata"]["name"]))
        delay = self._held_back(body, previous, api_failure.failed_status(previous, err, now))
        return PassOutcome(Result.ERROR, str(err), requeue_after=delay)

    def _held_back(
        self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus
    ) -> float:
        """A pass that could not act: write `new` (why) and return the back-off before the next try, which doubles
        with each consecutive such pass of the job (a pass that acts resets it)."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        self._write(body, previous, new)
        return self.backoff.delay(failures)

    def _act(
        self,
        job: builders.JobRef,
        spec: ZeroTrainingJobSpec,
        sized: ZeroTrainingJobSpec,
        d: Decision,
        apply_supporting: bool,
    ) -> None:
        """Make the cluster match the decision (`spec` is what the ranks read, `sized` the gang in force); a refused
        child write raises ChildWriteError naming the child."""
        # Service, ConfigMap and RBAC follow the spec: applied when it changes and before every gang starts,
        # not on each of the many pod events in between.
        if apply_supporting and d.status.phase not in TERMINAL and d.status.phase != Phase.SUSPENDED:
            self._apply_supporting(job, builders.build_supporting(job, sized))
        for pod_name in d.delete_pods:
            with child_write("delete", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name}}):
                self.client.delete_pod(job.namespace, job.name, pod_name)
        if d.create_gang:
            self._create_gang(job, spec, sized, d)
        if d.create_probes:
            gang = d.status.restarts.total
            existing = {p["metadata"]["name"] for p in self.client.pods(job.namespace, job.name)}
            probes = [builders.build_probe(job, sized, gang, i) for i in d.create_probes]
            self._create_pods(job, [p for p in probes if p["metadata"]["name"] not in existing])
        if d.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished passed", job.namespace, job.name)
            self.kube.delete_job(job.namespace, job.name)

    def _create_gang(
        self, job: builders.JobRef, spec: ZeroTrainingJobSpec, sized: ZeroTrainingJobSpec, d: Decision
    ) -> None:
        """The gang's ConfigMap, then its pods that do not exist yet, at most max_pod_creates_per_pass of them: a gang
        larger than that is created over several passes (Created=False/GangCreating says how far), so one job's pass
        never runs for minutes while the others wait for a thread."""
        gang = d.status.restarts.total
        present = self.client.pods(job.namespace, job.name)
        existing = {p["metadata"]["name"] for p in present}
        # An earlier pass began this gang: its ConfigMap exists and the previous gang's is gone.
        begun = any(
            (p["metadata"].get("labels") or {}).get(naming.LABEL_GANG) == str(gang)
            and naming.LABEL_PROBE not in (p["metadata"].get("labels") or {})
            for p in present
        )
        config, *gang_pods = builders.build_gang(job, spec, gang, sized.replicas)
        if not begun:
            with child_write("create", config):
                self.kube.ensure(config)  # created once per gang; a retry keeps the first one (immutable)
            if gang > 0:  # the previous gang's pods are gone (a gang is created only then): so goes its config, now,
                # before a pod exists, as a pass that fails creating pods leaves the gang begun
                old = naming.config_map_name(job.name, gang - 1)
                with child_write("delete", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": old}}):
                    self.kube.delete_config_map(job.namespace, old)
        todo = [p for p in gang_pods if p["metadata"]["name"] not in existing]
        limit = self.settings.max_pod_creates_per_pass
        self._create_pods(job, todo[:limit])
        if len(todo) > limit:
            done = len(gang_pods) - len(todo) + limit
            message = f"{done} of {len(gang_pods)} pods of gang {gang} created; the next pass creates more"
            set_condition(d.status, ConditionType.CREATED, False, Reason.GANG_CREATING, message, self.clock())
            d.requeue_after = 0.0
        elif not is_true(d.status, ConditionType.CREATED, Reason.GANG_CREATED):
            msg = gang_created_message(d.status)
            set_condition(d.status, ConditionType.CREATED, True, Reason.GANG_CREATED, msg, self.clock())

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

    def _apply_supporting(self, job: builders.JobRef, objs: list[dict[str, Any]]) -> None:
        """Apply the job's ServiceAccount, Role, Service and PodGroup at once, then its RoleBinding: one after another
        they made a new job's first pass several round trips longer than its pods'. A RoleBinding waits for its Role:
        without `bind`, the server checks that the operator holds what the Role grants, and refuses the binding while
        the Role does not exist. All are applied before any pod is created: a real server refuses a pod whose
        ServiceAccount does not exist."""
        self._on_workers(job, "apply", self.client.apply, [o for o in objs if o["kind"] != "RoleBinding"])
        self._on_workers(job, "apply", self.client.apply, [o for o in objs if o["kind"] == "RoleBinding"])

    def _create_pods(self, job: builders.JobRef, pods: list[dict[str, Any]]) -> None:
        """Create pods through the operator's shared workers (one after another, a 128-pod gang took seconds)."""
        self._on_workers(job, "create", self.client.create_pod, pods)

    def _on_workers(
        self, job: builders.JobRef, verb: str, write: Callable[[dict[str, Any]], None], objs: list[dict[str, Any]]
    ) -> None:
        """`write` each child on the operator's shared workers, this job's in turn with every other job's (a pool
        of its own would let a big gang crowd out a small job beside it); returns once all are answered. The first
        refusal, in `objs`' order, is the one raised (and the one the status reports)."""

        def one(obj: dict[str, Any]) -> None:
            with child_write(verb, obj):
                write(obj)

        for future in self._creates.map((job.namespace, job.name), one, objs):
            future.result()

    def _write(self, body: dict[str, Any], previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus) -> None:
        md = body["metadata"]
        key = (md["namespace"], md["name"])
        view = JobView(new.phase, dict(new.restarts.by_cause), new.replicas, new.stage)
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


def replan_cause(previous: ZeroTrainingJobStatus | None, d: Decision) -> str | None:
    """Why the stage in force changed in this pass, if it did: stage auto moving past a stage that ran out of
    memory, choosing again at a new size, or the spec changed."""
    before, after = (previous.stage if previous else None), d.status.stage
    if before is None or after is None or before == after:
        return None
    if d.resize is not None:
        return resize.RESIZED
    return Reason.OUT_OF_MEMORY if previous and previous.stage_floor == after else "SpecChanged"


@contextlib.contextmanager
def child_write(verb: str, obj: dict[str, Any]) -> Iterator[None]:
    """Turn the server's refusal of a write to `obj` into a ChildWriteError that names the child."""
    try:
        yield
    except KubeError as e:
        md = obj.get("metadata", {})
        raise ChildWriteError(verb, obj.get("kind", "?"), obj.get("apiVersion", "?"), md.get("name", "?"), e) from e
