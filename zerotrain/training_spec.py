"""How a ZeroTrainingJob trains (`spec.training`, `spec.checkpoint`, `spec.metrics`, `spec.failurePolicy`): the
optimizer, schedule, evaluation, checkpoints and restarts."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from zerotrain._model import Rule, SpecModel


class OptimizerName(str, Enum):
    """The element-wise torch optimizer run on each rank's fp32 shard."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


class OptimizerSpec(SpecModel):
    """Optimizer hyper-parameters."""

    name: OptimizerName = OptimizerName.ADAMW
    """Which torch optimizer."""
    lr: float = Field(default=1e-3, gt=0)
    """Learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled (AdamW) or L2 (Adam, SGD) weight decay, except on zero.noWeightDecay parameters."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = Field(default=1e-8, gt=0)
    """Adam epsilon."""
    momentum: float = Field(default=0.0, ge=0)
    """SGD momentum."""


class LrDecay(str, Enum):
    """How the learning rate falls after the warm-up."""

    COSINE = "cosine"
    """Half a cosine from lr down to minLrRatio × lr over decaySteps."""
    LINEAR = "linear"
    """A straight line from lr down to minLrRatio × lr over decaySteps."""
    CONSTANT = "constant"
    """lr after the warm-up, to the end."""


class LrSchedule(SpecModel):
    """The learning rate of every step: a linear warm-up from 0, then a decay to minLrRatio × lr (the schedules of
    `transformers`' `get_cosine_with_min_lr_schedule_with_warmup` and torchtitan). Step t (1, 2, … steps) trains at
    lr × t/warmupSteps while t ≤ warmupSteps, then at lr × (m + (1 − m)·d(p)) with p = min((t − warmupSteps) /
    decaySteps, 1), m = minLrRatio and d the decay (cosine ½(1 + cos πp), linear 1 − p, constant 1). A pure function
    of the step, which checkpoints hold: a resumed run trains every step at the same learning rate."""

    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warm-up from 0 (step t at t/warmupSteps of lr); 0 starts at lr."""
    decay: LrDecay = LrDecay.COSINE
    """cosine, linear or constant after the warm-up."""
    decay_steps: int | None = Field(default=None, ge=1)
    """Steps from the end of the warm-up to the bottom of the decay (minLrRatio × lr, kept after); by default
    training.steps − warmupSteps, so the run ends at the bottom."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Where the decay ends, as a fraction of lr (0.1: a tenth)."""


class EvaluationSpec(SpecModel):
    """Forward-only evaluation on the task's held-out micro-batches (`TrainingTask.eval_batches`): every rank runs
    them in eval mode under no_grad, the loss is averaged over ranks, and nothing of the training changes."""

    every_steps: int = Field(ge=1)
    """Evaluate after every this many optimizer steps, and after the last."""
    batches: int = Field(default=10, ge=1)
    """Evaluation micro-batches per rank each time (the first this many of the task's; the same ones every time)."""


class TrainingSpec(SpecModel):
    """The training loop the runtime drives."""

    rules = (
        Rule(
            "!has(self.lrSchedule) || !has(self.lrSchedule.warmupSteps) || "
            "self.lrSchedule.warmupSteps <= (has(self.steps) ? self.steps : 100)",
            lambda t: t.lr_schedule is None or t.lr_schedule.warmup_steps <= t.steps,
            "training.lrSchedule.warmupSteps is beyond training.steps: the run would end still warming up; use fewer "
            "warm-up steps (a few percent of steps is usual) or train longer",
            ("lr_schedule.warmup_steps", "steps"),
        ),
    )

    steps: int = Field(default=100, ge=1)
    """Optimizer steps to run."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimizer and its hyper-parameters."""
    seed: int = 0
    """Random seed (model initialisation and data order are identical on every rank)."""
    log_every: int = Field(default=1, ge=1)
    """Report loss and throughput every this many steps."""
    lr_schedule: LrSchedule | None = None
    """Warm-up and decay of optimizer.lr over the steps; without it the learning rate stays optimizer.lr."""
    evaluation: EvaluationSpec | None = None
    """Evaluate on the task's held-out data every so many steps and at the end; without it nothing is evaluated."""


class CheckpointSpec(SpecModel):
    """Where and how often sharded checkpoints are written."""

    claim_name: str | None = None
    """PersistentVolumeClaim mounted at `path` in every pod; without it the path is an emptyDir."""
    path: str | None = None
    """Directory of the checkpoints as every rank sees it; unset, no checkpoints are written. In a pod the operator
    mounts the checkpoint volume here (at DEFAULT_CHECKPOINT_DIR when unset) and gives the ranks that path;
    `zerotrain run` sets it from --checkpoint-dir (none without)."""
    interval_steps: int = Field(default=100, ge=1)
    """Save every this many optimizer steps (and at the end)."""
    keep_last: int = Field(default=3, ge=1)
    """How many complete checkpoints to keep; older ones are deleted after a newer one commits."""
    save_on_termination: bool = True
    """On SIGTERM (eviction, preemption, deletion) every rank finishes its current step and commits a checkpoint
    before exiting, so the restarted gang resumes from that step."""
    async_save: bool = Field(default=False, alias="async")
    """Write checkpoints in the background: the step loop is blocked only while each rank copies its shard into
    host memory (pinned on GPUs, reused between saves); the file is written and fsynced by a thread, and the
    checkpoint commits at the first step at which every rank's write is done. At most one save is in flight;
    SIGTERM and the end of training wait for it, then save the last step synchronously. Needs a filesystem that can
    fsync a directory."""
    termination_budget_seconds: int = Field(default=120, ge=5, le=3600)
    """Seconds from SIGTERM for the current step and that checkpoint; past it the ranks exit without committing
    (the previous checkpoint stands). The operator sets the pods' terminationGracePeriodSeconds to this plus
    TERMINATION_MARGIN_SECONDS, so Kubernetes does not kill them first."""


DEFAULT_CHECKPOINT_DIR = "/checkpoints"
"""Where a pod mounts its checkpoint volume when spec.checkpoint.path is unset."""

TERMINATION_MARGIN_SECONDS = 15
"""Grace beyond spec.checkpoint.terminationBudgetSeconds: the launcher's own exit and the kubelet's slack."""


class MetricsSpec(SpecModel):
    """Per-rank Prometheus metrics."""

    enabled: bool = True
    """Serve /metrics from every rank."""
    port: int = Field(default=9400, ge=1024, le=65535)
    """Port of local rank 0; local rank r serves on port + r."""


class StragglerSpec(SpecModel):
    """Naming the rank that holds the gang back, and why (docs/monitoring.md, "Stragglers")."""

    enabled: bool = True
    """Compare the ranks' step splits every `windowSteps` steps (one small all-reduce per window)."""
    threshold: float = Field(default=1.3, ge=1.05, le=10.0)
    """A rank is named when its data wait or compute per step is at least this many times the other ranks' median
    (and the excess at least 5% of the median step)."""
    window_steps: int = Field(default=10, ge=2, le=10_000)
    """Steps in each comparison (each rank's median step); a rank is named once two windows in a row find it slow,
    and cleared once two windows in a row do not."""


class RestartStrategy(str, Enum):
    """How the gang restarts after a failure the job survives."""

    IN_PLACE = "InPlace"
    """Every pod still alive keeps running: its launcher stops its ranks, and the gang's ranks start again inside the
    same pods (one rendezvous round more) from the newest committed checkpoint. Only pods that are gone are
    recreated. Needs spec.checkpoint.claimName (a recreated pod must find the checkpoint); a restart that changes
    the gang (stage auto moving on, a resize) or whose Kueue group lost a pod recreates every pod."""
    RECREATE = "Recreate"
    """Every pod of the gang is deleted and created again (scheduled, started and its image pulled anew)."""


class FailurePolicy(SpecModel):
    """What a failed rank does to the job."""

    rules = (
        Rule(
            "!has(self.permanentExitCodes) || !has(self.retryableExitCodes) || "
            "self.permanentExitCodes.all(c, !(c in self.retryableExitCodes))",
            lambda f: not set(f.permanent_exit_codes) & set(f.retryable_exit_codes),
            "an exit code is both permanent and retryable; list each code in only one of "
            "permanentExitCodes and retryableExitCodes",
            ("permanent_exit_codes", "retryable_exit_codes"),
        ),
    )

    backoff_limit: int = Field(default=3, ge=0)
    """Gang restarts allowed for failures (preemption and eviction don't count)."""
    permanent_exit_codes: list[int] = Field(default_factory=lambda: [2], max_length=64)
    """Exit codes that fail the job at once (2: the runtime refused its configuration)."""
    retryable_exit_codes: list[int] = Field(default_factory=list, max_length=64)
    """If non-empty, only these codes restart the gang; any other non-zero code fails the job."""
    restart_strategy: RestartStrategy = RestartStrategy.IN_PLACE
    """How a restart is done: InPlace (the pods still alive keep running and start their ranks again) or
    Recreate (every pod deleted and created again). InPlace falls back to Recreate where it cannot apply (no
    checkpoint.claimName; stage auto moving on; a resize; a Kueue group that lost a pod)."""
    rejoin_timeout_seconds: int = Field(default=120, ge=1)
    """InPlace: seconds a living pod has, from the restart, to stop its ranks and report; one that has not is
    deleted and recreated (the job's status names it)."""
