"""Elastic gangs: `spec.elastic` lets the operator run a job at another size between minReplicas and maxReplicas,
and the arithmetic that keeps the manifest's global batch at every such size. Pure; no torch, no I/O.

A step of the manifest's gang consumes G micro-batches on each of its W ranks: W·G *slots* of b rows (b = one
rank's micro-batch). At W' ranks the same step runs G' = W·G / W' micro-batches per rank, so the slots, the rows
in each, the global batch and every rank's activation memory stay what the manifest says; only a size W' that
divides W·G can run. Slot s of a step is rows [(s mod W)·b, (s mod W + 1)·b) of the step's global micro-batch
s div W (the manifest's own layout), and rank r' takes slots r', r' + W', r' + 2W', …: at W' = W that is exactly
the non-elastic layout, so a run that shrinks and grows back trains on the same rows as one that never moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from zerotrain._model import Rule, SpecModel


class ElasticSpec(SpecModel):
    """Sizes the operator may run the gang at when it cannot be formed at its own."""

    rules = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            lambda e: e.min_replicas <= e.max_replicas,
            "elastic.minReplicas is above elastic.maxReplicas; set minReplicas <= maxReplicas",
            ("min_replicas", "max_replicas"),
        ),
    )

    min_replicas: int = Field(ge=1)
    """The fewest pods the gang may shrink to when pods cannot be scheduled or a node is lost."""
    max_replicas: int = Field(ge=1)
    """The most pods the gang may grow to when capacity appears (it starts at spec.replicas)."""
    hold_off_seconds: int = Field(default=600, ge=0)
    """After a resize, seconds before the gang looks for room to grow again: a gang that just shrank does not
    bounce back and forth, and each growth costs one checkpointed restart. Doubled for each growth in a row that
    had to shrink back."""


@dataclass(frozen=True)
class Layout:
    """How a step's micro-batch slots fall on the ranks of a gang of another size than the manifest's."""

    reference_world: int
    """W: ranks of the manifest's gang (replicas × nprocPerNode)."""
    reference_accumulation: int
    """G: the manifest's gradientAccumulationSteps."""
    world: int
    """W': ranks running now."""

    @property
    def accumulation(self) -> int:
        """G' = W·G / W': micro-batches per rank and step at this size."""
        return self.reference_world * self.reference_accumulation // self.world

    def slot(self, step_index: int, micro: int, rank: int) -> tuple[int, int]:
        """(global micro-batch, rank-share of it) that rank `rank`'s micro-batch `micro` of step `step_index`
        (0-based) trains on: share k is rows [k·b, (k+1)·b) of that global micro-batch."""
        s = micro * self.world + rank
        return step_index * self.reference_accumulation + s // self.reference_world, s % self.reference_world


def divides(slots: int, replicas: int, nproc: int) -> bool:
    """Whether a gang of `replicas` pods splits a step's `slots` (W·G) evenly."""
    return slots % (replicas * nproc) == 0


def step_slots(replicas: int, nproc: int, accumulation: int) -> int:
    """W·G: the micro-batch slots of one step of the manifest's gang."""
    return replicas * nproc * accumulation


def accumulation_at(replicas: int, nproc: int, accumulation: int, at: int) -> int:
    """G' = W·G / W': micro-batches per rank and step of a gang of `at` pods, for a manifest of `replicas` pods of
    `nproc` ranks accumulating `accumulation` (at least 1; exact for the sizes `sizes` returns)."""
    return max(1, step_slots(replicas, nproc, accumulation) // (at * nproc))


def sizes(replicas: int, nproc: int, accumulation: int, elastic: ElasticSpec) -> list[int]:
    """Replica counts in [minReplicas, maxReplicas] the manifest's global batch divides evenly, ascending."""
    slots = step_slots(replicas, nproc, accumulation)
    return [r for r in range(elastic.min_replicas, elastic.max_replicas + 1) if divides(slots, r, nproc)]


def accumulation_for_all(replicas: int, elastic: ElasticSpec) -> int:
    """The smallest gradientAccumulationSteps at which every size in the range divides a step's slots."""
    need = 1
    for r in range(elastic.min_replicas, elastic.max_replicas + 1):
        need = math.lcm(need, r // math.gcd(r, replicas))
    return need


def refusal(replicas: int, nproc: int, accumulation: int, elastic: ElasticSpec) -> str | None:
    """Why an elastic range is unusable (replicas outside it, or no other size divides the batch), else None."""
    lo, hi = elastic.min_replicas, elastic.max_replicas
    if not lo <= replicas <= hi:
        return (
            f"replicas {replicas} is outside elastic [{lo}, {hi}]; set replicas between elastic.minReplicas and "
            "elastic.maxReplicas (the gang starts at replicas)"
        )
    if lo < hi and sizes(replicas, nproc, accumulation, elastic) == [replicas]:
        slots = step_slots(replicas, nproc, accumulation)
        fix = accumulation * accumulation_for_all(replicas, elastic)
        return (
            f"elastic [{lo}, {hi}]: no size but replicas {replicas} divides the global batch's {slots} micro-batch "
            f"slots per step (gradientAccumulationSteps {accumulation} × {replicas * nproc} ranks), so the gang "
            f"could never resize; set zero.gradientAccumulationSteps to {fix} (every size in the range divides it)"
        )
    return None


def layout(replicas: int, nproc: int, accumulation: int, world_size: int) -> Layout | None:
    """The layout of a gang of `world_size` ranks for a manifest of `replicas` × `nproc` (None when that is the
    manifest's own size); ValueError when the size does not divide the global batch."""
    reference = replicas * nproc
    if world_size == reference:
        return None
    slots = step_slots(replicas, nproc, accumulation)
    if slots % world_size:
        raise ValueError(
            f"WORLD_SIZE {world_size} does not divide the {slots} micro-batch slots of a step "
            f"(zero.gradientAccumulationSteps {accumulation} × {reference} ranks); run a size that divides it"
        )
    return Layout(reference, accumulation, world_size)
