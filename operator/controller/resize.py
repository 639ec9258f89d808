"""Elastic gangs (`spec.elastic`): when a gang shrinks, when it looks for room, when it grows. Pure, like `status`.

- Shrink: pods of the gang stay unschedulable past scheduling.startupTimeoutSeconds (no room, or a node lost and
  the restarted gang finds no place for its pods). The gang restarts at the largest size in [minReplicas, current)
  that the scheduled pods can hold, that divides the global batch and whose plan fits (stage auto re-plans).
- Grow: once the gang runs below maxReplicas and elastic.holdOffSeconds have passed since its last resize (or its
  start), the operator keeps one capacity probe per missing pod: a pod with a rank's scheduling constraints and
  resources that runs nothing. When the scheduler places probes, the gang restarts at the largest size they make
  room for; deleting the pods makes every rank commit its current step (checkpoint.saveOnTermination), so the
  bigger gang resumes at that step without losing one. The probes stay until the bigger gang is created, so the
  room they hold is not taken while the ranks save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from zerotrain import elastic
from zerotrain.elastic import ElasticSpec
from zerotrain.job_status import MAX_RESIZES_KEPT, Phase, Resize, ResizeCause, ZeroTrainingJobStatus
from zerotrain.operator.controller.observe import ObservedPod, PodPhase
from zerotrain.plan.model_states import MemoryPlan
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

RESIZED = "Resized"
"""The restart cause (status.restarts.byCause) and condition reason of a resize; not counted as a failure."""


@dataclass(frozen=True)
class SizeVerdict:
    """Whether a gang of some size would be admitted: its plan fits (at the stage auto would choose there)."""

    admitted: bool
    stage: Stage | None = None
    why: str = ""
    plan: MemoryPlan | None = None
    """Admission's plan at that size."""


@dataclass(frozen=True)
class Sizing:
    """What a pass knows about an elastic job's sizes."""

    elastic: ElasticSpec
    manifest: ZeroTrainingJobSpec
    """The manifest's spec (its replicas and accumulation define the global batch)."""
    check: Callable[[int], SizeVerdict]
    """Admission at that many pods (called only for sizes a resize could move to)."""

    def sizes(self) -> list[int]:
        m = self.manifest
        return elastic.sizes(m.replicas, m.nproc_per_node, m.zero.gradient_accumulation_steps, self.elastic)

    def accumulation(self, replicas: int) -> int:
        m = self.manifest
        return elastic.accumulation_at(m.replicas, m.nproc_per_node, m.zero.gradient_accumulation_steps, replicas)


@dataclass
class ResizeStep:
    """A resize the pass decided: the new size, its record, and admission's plan there (the status's from now on)."""

    replicas: int
    record: Resize
    plan: MemoryPlan | None = None


def _largest(sizing: Sizing, low: int, high: int) -> tuple[int, SizeVerdict, list[str]] | None:
    """The largest size in (low, high] that divides the batch and is admitted; the refusals of larger ones."""
    refused: list[str] = []
    for r in sorted((r for r in sizing.sizes() if low < r <= high), reverse=True):
        verdict = sizing.check(r)
        if verdict.admitted:
            return r, verdict, refused
        refused.append(f"{r}: {verdict.why}")
    return None


def _record(
    sizing: Sizing, before: int, after: int, cause: ResizeCause, verdict: SizeVerdict, message: str, now: datetime
) -> Resize:
    acc = sizing.accumulation(after)
    return Resize(
        from_replicas=before,
        to_replicas=after,
        cause=cause,
        gradient_accumulation_steps=acc,
        stage=verdict.stage,
        time=now,
        message=f"{message}; {after} pods × {sizing.manifest.nproc_per_node} ranks, {acc} micro-batches a rank "
        "per step keep the global batch",
    )


@dataclass(frozen=True)
class NoShrink:
    """Pods are stuck, and no smaller size can run: why, for the Unschedulable condition."""

    why: str


def shrink(
    spec: ZeroTrainingJobSpec, sizing: Sizing, current: Sequence[ObservedPod], now: datetime
) -> ResizeStep | NoShrink | None:
    """Shrink when gang pods stayed unschedulable past the startup timeout and a smaller size fits what was
    scheduled; NoShrink saying why not when none does; None when nothing is stuck."""
    limit = timedelta(seconds=spec.scheduling.startup_timeout_seconds)
    late = [
        p
        for p in current
        if p.phase == PodPhase.PENDING and p.unschedulable and not p.gated and p.created and now - p.created > limit
    ]
    if not late:
        return None
    placed = sum(1 for p in current if p.scheduled)
    found = _largest(sizing, sizing.elastic.min_replicas - 1, min(placed, spec.replicas - 1))
    if found is None:
        low = sizing.elastic.min_replicas
        if placed < low:
            return NoShrink(f"elastic: {placed} pod(s) scheduled, fewer than minReplicas={low}")
        refused = [f"{r}: {sizing.check(r).why}" for r in sizing.sizes() if low <= r <= min(placed, spec.replicas - 1)]
        return NoShrink("elastic: no smaller size runs (" + ("; ".join(refused) or "none divides the batch") + ")")
    size, verdict, _ = found
    message = (
        f"{len(late)} of {spec.replicas} pods unschedulable for over startupTimeoutSeconds="
        f"{spec.scheduling.startup_timeout_seconds} ({late[0].name}: {late[0].unschedulable}); {placed} scheduled"
    )
    record = _record(sizing, spec.replicas, size, ResizeCause.UNSCHEDULABLE, verdict, message, now)
    return ResizeStep(size, record, verdict.plan)


@dataclass
class GrowPlan:
    """What the pass does toward growing: probes to create or replace, a resize, or when to look again."""

    create_probes: list[int] = field(default_factory=list)
    delete_probes: list[str] = field(default_factory=list)
    step: ResizeStep | None = None
    look_again_in: float | None = None


def grow(
    spec: ZeroTrainingJobSpec,
    sizing: Sizing,
    st: ZeroTrainingJobStatus,
    probes: Sequence[ObservedPod],
    now: datetime,
) -> GrowPlan:
    """Probe for room once the hold-off has passed; grow when probes were placed. Probes are kept for the next
    size up only (growth goes a size at a time): a placed probe holds a node idle while it waits for the others."""
    plan = GrowPlan()
    up = [r for r in sizing.sizes() if spec.replicas < r <= sizing.elastic.max_replicas]
    if not up or st.phase != Phase.RUNNING:
        return plan
    missing = up[0] - spec.replicas
    since = st.resizes[-1].time if st.resizes and st.resizes[-1].time else st.start_time or now
    due = since + timedelta(seconds=hold_off(sizing.elastic, st.resizes))
    if now < due:
        plan.look_again_in = (due - now).total_seconds()
        return plan
    # A probe that ended (evicted, its container failed) holds nothing: replace it.
    live = [p for p in probes if p.phase in (PodPhase.PENDING, PodPhase.RUNNING)]
    plan.delete_probes = sorted(p.name for p in probes if p not in live)
    have = {p.probe for p in live}
    plan.create_probes = [i for i in range(missing) if i not in have and i not in {p.probe for p in probes}]
    placed = sum(1 for p in live if p.scheduled)
    found = _largest(sizing, spec.replicas, spec.replicas + placed) if placed else None
    if found is None:
        return plan
    size, verdict, refused = found
    message = f"{placed} capacity probe(s) scheduled after the {sizing.elastic.hold_off_seconds}s hold-off"
    if refused:
        message += f" (not admitted: {'; '.join(refused)})"
    record = _record(sizing, spec.replicas, size, ResizeCause.CAPACITY_RETURNED, verdict, message, now)
    plan.create_probes = []
    plan.step = ResizeStep(size, record, verdict.plan)
    return plan


def hold_off(spec: ElasticSpec, resizes: Sequence[Resize]) -> float:
    """Seconds before looking for room again: elastic.holdOffSeconds, doubled for each growth in a row that had
    to shrink back (the room the probes saw was gone by the time the bigger gang came), so a gang never bounces
    at the rate of the hold-off."""
    bounced, end = 0, len(resizes)
    while end >= 2 and (resizes[end - 2].cause, resizes[end - 1].cause) == (
        ResizeCause.CAPACITY_RETURNED,
        ResizeCause.UNSCHEDULABLE,
    ):
        bounced, end = bounced + 1, end - 2
    return float(spec.hold_off_seconds * 2 ** min(bounced, 10))


def keep(st: ZeroTrainingJobStatus, step: ResizeStep) -> None:
    """Put the resize into status: the new size and the record (the newest MAX_RESIZES_KEPT)."""
    st.replicas = step.replicas
    st.resizes = [*st.resizes, step.record][-MAX_RESIZES_KEPT:]
