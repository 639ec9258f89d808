"""What admission decided for a pass, recorded in the status by `compute_status` with the rest of it: the memory
plan, the stage in force (auto's choice with its reason), the generation seen and the Kueue queue found again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import ConditionType, Reason, is_true, set_condition
from zerotrain.planner import MemoryPlan
from zerotrain.zero_config import Stage


@dataclass(frozen=True)
class Moved:
    """A resize's next gang: admission's plan at the new size, and the stage the resize recorded."""

    plan: MemoryPlan | None
    stage: Stage | None


@dataclass(frozen=True)
class PassFacts:
    """The admitted job as this pass saw it."""

    stage: Stage
    """The stage the gang runs (auto's choice, or the manifest's)."""
    plan: MemoryPlan | None = None
    """Admission's memory plan at the gang's size."""
    stage_chosen: str | None = None
    """Auto's choice, as StageChosen's message; None for a fixed stage."""
    generation: int | None = None
    """metadata.generation of the job this pass read."""
    queue: str | None = None
    """The job's Kueue queue (its label), if any: a QueueUnavailable condition says it was found again."""


def record(facts: PassFacts, status: ZeroTrainingJobStatus, moved: Moved | None, now: datetime) -> None:
    """Write `facts` into `status`; `moved`: a resize this pass made, whose next gang's plan and stage are the
    ones in force from now on."""
    status.memory_plan, status.stage = facts.plan, facts.stage
    if moved is not None:
        status.memory_plan, status.stage = moved.plan, moved.stage
    if facts.stage_chosen is not None:
        set_condition(status, ConditionType.STAGE_CHOSEN, True, Reason.LOWEST_STAGE_THAT_FITS, facts.stage_chosen, now)
    status.observed_generation = facts.generation
    if is_true(status, ConditionType.QUEUE_UNAVAILABLE):
        found = f"LocalQueue {facts.queue!r} found" if facts.queue else "the job names no Kueue queue any more"
        set_condition(status, ConditionType.QUEUE_UNAVAILABLE, False, Reason.QUEUE_FOUND, found, now)
