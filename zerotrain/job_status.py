"""Observed state of a ZeroTrainingJob (`status`), written by the operator and, for progress, by rank 0."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import Field

from zerotrain._model import SpecModel
from zerotrain.goodput import GangClock, GoodputStatus, JobProgress
from zerotrain.plan.model_states import MemoryPlan
from zerotrain.training_spec import RestartStrategy
from zerotrain.zero_config import Stage


class Phase(str, Enum):
    """Lifecycle phase of a job."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class Condition(SpecModel):
    """A Kubernetes-style condition."""

    type: str
    """Condition type (Created, Running, Restarting, Succeeded, Failed, Suspended, InvalidSpec, ...)."""
    status: str = Field(pattern="^(True|False|Unknown)$")
    """True, False or Unknown."""
    reason: str = ""
    """CamelCase machine-readable reason."""
    message: str = ""
    """Human-readable detail."""
    last_transition_time: datetime | None = None
    """When status last changed."""


class RankCounts(SpecModel):
    """Ranks by state (a pod's ranks count together)."""

    total: int = 0
    """Ranks the job runs."""
    ready: int = 0
    """Ranks in Ready pods."""
    running: int = 0
    """Ranks in Running pods."""
    succeeded: int = 0
    """Ranks in Succeeded pods."""
    failed: int = 0
    """Ranks in Failed pods."""


class Restarts(SpecModel):
    """Gang restarts."""

    total: int = 0
    """All gang restarts."""
    failures: int = 0
    """Restarts counted against failurePolicy.backoffLimit."""
    by_cause: dict[str, int] = Field(default_factory=dict)
    """Restarts per cause (Failed, Evicted, Preempted, NodeLost...)."""
    in_place: int = 0
    """Restarts done in place: the pods still alive kept and their ranks started again; only gone pods recreated."""
    strategy: RestartStrategy | None = None
    """How the newest restart is done (InPlace, or Recreate where spec.failurePolicy asks for it or InPlace cannot
    apply); null before the first."""


class ResizeCause(str, Enum):
    """Why an elastic gang changed size."""

    UNSCHEDULABLE = "Unschedulable"
    """Pods of the gang stayed unschedulable past scheduling.startupTimeoutSeconds (no room, a node lost)."""
    CAPACITY_RETURNED = "CapacityReturned"
    """Capacity probes for the missing pods were scheduled: the gang grows at a checkpoint."""


class Resize(SpecModel):
    """One change of an elastic gang's size."""

    from_replicas: int
    """Pods before."""
    to_replicas: int
    """Pods after."""
    cause: ResizeCause
    """Unschedulable or CapacityReturned."""
    gradient_accumulation_steps: int
    """Micro-batches per rank and step at the new size (the manifest's global batch kept)."""
    stage: Stage | None = None
    """The ZeRO stage in force at the new size (stage auto re-plans it)."""
    time: datetime | None = None
    """When the operator decided it."""
    message: str = ""
    """What it saw, with the figures."""


MAX_RESIZES_KEPT = 10
"""status.resizes keeps the newest this many; the operator's resize counter keeps the totals."""


class CheckpointStatus(SpecModel):
    """The newest committed checkpoint."""

    step: int
    """Optimizer step it holds."""
    path: str = ""
    """Its directory."""
    time: datetime | None = None
    """When it was committed."""


class EvaluationStatus(SpecModel):
    """The newest evaluation (spec.training.evaluation)."""

    step: int
    """The optimizer step it followed."""
    loss: float
    """Its loss: the mean over every rank's evaluation micro-batches."""
    time: datetime | None = None
    """When rank 0 reported it."""


class StragglerCause(str, Enum):
    """What holds a straggling rank back."""

    INPUT = "input"
    """Its data wait: the task's batches reach it later than the other ranks'."""
    COMPUTE = "compute"
    """Its forward, backward and optimizer step."""


class StragglerStatus(SpecModel):
    """A rank rank 0 named as holding the gang back, at the end of a window of steps (docs/monitoring.md)."""

    rank: int = Field(ge=0)
    """The straggling rank."""
    cause: StragglerCause
    """Input (its data wait) or compute."""
    seconds_per_step: float = Field(ge=0)
    """Its data wait or compute per step over the window."""
    others_seconds_per_step: float = Field(ge=0)
    """The median of the other ranks' over the same window."""
    window_steps: int = Field(ge=1)
    """Steps in the window."""
    step: int = Field(ge=0)
    """The step the window ended at."""


class ZeroTrainingJobStatus(SpecModel):
    """Observed state of a ZeRO training job."""

    phase: Phase = Phase.PENDING
    """Pending, Running, Restarting, Succeeded, Failed or Suspended."""
    conditions: list[Condition] = Field(default_factory=list)
    """Latest observations."""
    ranks: RankCounts = Field(default_factory=RankCounts)
    """Ranks by state."""
    restarts: Restarts = Field(default_factory=Restarts)
    """Gang restarts."""
    step: int | None = None
    """Latest optimizer step reported by rank 0."""
    start_time: datetime | None = None
    """When the first gang started."""
    completion_time: datetime | None = None
    """When the job succeeded or failed."""
    last_checkpoint: CheckpointStatus | None = None
    """Newest committed checkpoint; a restarted gang resumes from it."""
    last_evaluation: EvaluationStatus | None = None
    """Newest evaluation loss and its step, reported by rank 0."""
    stragglers: list[StragglerStatus] = Field(default_factory=list, max_length=64)
    """The ranks the last window named as holding the gang back, reported by rank 0 (empty: the gang keeps pace);
    condition Straggler names their pods and nodes."""
    gang_clock: GangClock | None = None
    """Rank 0's reading of its gang's clock, reported with its progress; the operator folds it into goodput."""
    goodput: GoodputStatus | None = None
    """Where the job's wall time went: pending, starting, training, evaluating, checkpointing, lost and restarting
    (docs/monitoring.md); kept by the operator across gang and operator restarts."""
    progress: JobProgress | None = None
    """Steps done in per cent and the time left at the ledger's training rate (restarts and queueing left out)."""
    memory_plan: MemoryPlan | None = None
    """Per-rank model-state memory by ZeRO stage for this job."""
    stage: Stage | None = None
    """The ZeRO stage the ranks run: the spec's, or the one `stage: auto` chose (condition StageChosen says why)."""
    replicas: int | None = None
    """Pods of the gang in force: spec.replicas, or for an elastic job the size it runs at now (status.ranks.total
    counts its ranks)."""
    resizes: list[Resize] = Field(default_factory=list)
    """An elastic gang's resizes, oldest first (the newest MAX_RESIZES_KEPT)."""
    activation_checkpointing: bool | None = None
    """`stage: auto`: true once stage 3 ran out of memory with zero.activationCheckpointing off; the gang then
    recomputes each unit's activations in backward (the last move auto has)."""
    stage_floor: Stage | None = None
    """`stage: auto`: the lowest stage admission may choose, raised past a stage whose ranks ran out of memory."""
    next_restart_time: datetime | None = None
    """When a gang torn down after a failure is created again (exponential back-off); null when none is due."""
    observed_generation: int | None = None
    """metadata.generation this status describes."""
