"""What a pass learned besides its pods, recorded in the status by pure functions:

- `PassFacts`, what admission decided (the memory plan, the stage in force with auto's reason, the generation seen,
  the Kueue queue found again), recorded by `compute_status` with the rest of the decision;
- `Acted`, what the pass's writes did (the gang's creation progress, a refused child write, a missing queue),
  recorded by `settle`, which gives the one status the pass writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.controller import api_failure
from zerotrain.operator.controller.api_failure import ChildWriteError
from zerotrain.operator.controller.conditions import (
    ConditionType,
    Reason,
    gang_created_message,
    get_condition,
    is_true,
    set_condition,
)
from zerotrain.plan.model_states import MemoryPlan
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
    created: datetime | None = None
    """metadata.creationTimestamp: where the job's goodput ledger starts."""


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


@dataclass(frozen=True)
class Acted:
    """What the pass's writes did, which the status says: how far the gang's creation got, a child write the server
    refused, or the job's Kueue queue missing (then nothing was written)."""

    gang_created: tuple[int, int] | None = None
    """(pods of the gang that exist now, pods in the gang) when this pass created some."""
    refused: ChildWriteError | None = None
    queue_missing: tuple[str, str] | None = None
    """(reason, message) when the gang waits for its Kueue LocalQueue."""
    kueue_says: str | None = None
    """What Kueue's Workload says the held gang waits for (condition Queued carries it)."""

    @property
    def held_back(self) -> bool:
        """The pass could not do what it decided: the status keeps the previous one's and says why."""
        return self.refused is not None or self.queue_missing is not None


@dataclass(frozen=True)
class Settled:
    """The whole status a pass writes, and when to look again."""

    status: ZeroTrainingJobStatus
    requeue_after: float | None


def settle(
    previous: ZeroTrainingJobStatus | None,
    decided: ZeroTrainingJobStatus,
    requeue_after: float | None,
    acted: Acted,
    now: datetime,
) -> Settled:
    """The status the pass writes, from the one `compute_status` decided and what the writes did. A pass held back
    keeps the previous status (nothing it decided happened) with the reason set; otherwise a ChildWriteFailed
    condition clears, and a gang created over several passes says how far it got and asks for the next pass now."""
    if acted.refused is not None:
        return Settled(api_failure.failed_status(previous, acted.refused, now), None)
    if acted.queue_missing is not None:
        st = (previous or ZeroTrainingJobStatus()).model_copy(deep=True)
        set_condition(st, ConditionType.QUEUE_UNAVAILABLE, True, *acted.queue_missing, now)
        return Settled(st, None)
    st = decided.model_copy(deep=True)
    api_failure.clear(st, now)
    if acted.kueue_says is not None and (queued := get_condition(st, ConditionType.QUEUED)) is not None:
        said = f"; Kueue: {acted.kueue_says}"
        if not queued.message.endswith(said):
            queued.message += said
    if acted.gang_created is not None:
        done, total = acted.gang_created
        if done < total:
            message = f"{done} of {total} pods of gang {st.restarts.total} created; the next pass creates more"
            set_condition(st, ConditionType.CREATED, False, Reason.GANG_CREATING, message, now)
            return Settled(st, 0.0)
        if not is_true(st, ConditionType.CREATED, Reason.GANG_CREATED):
            set_condition(st, ConditionType.CREATED, True, Reason.GANG_CREATED, gang_created_message(st), now)
    return Settled(st, requeue_after)
