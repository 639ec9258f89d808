"""The ZeroTrainingJob resource (`zerotrain.dev/v1alpha1`) as pydantic models.

One source of truth: the operator validates manifests with these models, `zerotrain run` reads them,
and `zerotrain crd` generates the CRD's OpenAPI schema from them.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from pydantic import Field, field_validator, model_validator

from zerotrain import elastic as elastic_sizes
from zerotrain._model import Rule, SpecModel
from zerotrain.elastic import ElasticSpec
from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.lora_config import LoraSpec
from zerotrain.zero_config import AutoStage, ZeroConfig, shard_group_ranks

GROUP = "zerotrain.dev"
VERSION = "v1alpha1"
KIND = "ZeroTrainingJob"
PLURAL = "zerotrainingjobs"
SINGULAR = "zerotrainingjob"
SHORT_NAMES = ["ztj"]
API_VERSION = f"{GROUP}/{VERSION}"

_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$|^\S+\.py$")
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# What a checkpoint was trained with: changing it under a running job would resume from incompatible state.
_IMMUTABLE: dict[str, Any] = {
    "x-kubernetes-validations": [
        {"rule": "self == oldSelf", "message": "is immutable (checkpoints depend on it); create a new job instead"}
    ]
}


class GangMode(str, Enum):
    """How the pods of a job are scheduled together."""

    NONE = "none"
    COSCHEDULING = "coscheduling"
    VOLCANO = "volcano"


class OptimizerName(str, Enum):
    """The element-wise torch optimizer run on each rank's fp32 shard."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


class Resources(SpecModel):
    """Compute resources of one pod (all its local ranks together)."""

    rules = (
        Rule(
            "!has(self.gpuMemory) || (has(self.gpu) && self.gpu > 0)",
            lambda r: r.gpu_memory is None or r.gpu > 0,
            "gpuMemory is set but gpu is 0; request GPUs with resources.gpu or drop gpuMemory",
            ("gpu_memory", "gpu"),
        ),
    )

    cpu: str | None = Field(default=None, pattern=_QUANTITY)
    """CPU request and limit per pod, a Kubernetes quantity (e.g. "8" or "500m")."""
    memory: str | None = Field(default=None, pattern=_QUANTITY)
    """Memory request and limit per pod, a Kubernetes quantity (e.g. "64Gi")."""
    gpu: int = Field(default=0, ge=0)
    """`nvidia.com/gpu` per pod; normally equal to nprocPerNode."""
    gpu_memory: str | None = Field(default=None, pattern=_QUANTITY)
    """Memory of one GPU (e.g. "80Gi"), used by admission to check the memory plan fits."""


class Attention(str, Enum):
    """How a transformer layer's attention keeps what backward needs."""

    FUSED = "fused"
    """A fused kernel (flash or memory-efficient `scaled_dot_product_attention`): no s x s score tensor is saved,
    only the output and one fp32 log-sum-exp per head and token."""
    MATERIALIZED = "materialized"
    """Scores are formed and softmaxed as tensors, which backward keeps: 2·a·s²·b elements per layer (plus a
    dropout mask of a·s²·b bytes with dropout)."""


class ModelShape(SpecModel):
    """A decoder-only transformer's shape, from which the plan derives its units and its activations per micro-batch
    (pre-norm blocks of attention and a GeLU MLP, learned positions, the output projection tied to the embedding)."""

    rules = (
        Rule(
            "self.hidden % self.heads == 0",
            lambda m: m.hidden % m.heads == 0,
            "shape.heads must divide shape.hidden; use a divisor of hidden",
            ("heads", "hidden"),
        ),
    )

    layers: int = Field(ge=1)
    """Transformer blocks (each one ZeRO unit)."""
    hidden: int = Field(ge=1)
    """Hidden size h."""
    heads: int = Field(ge=1)
    """Attention heads a; must divide hidden."""
    sequence_length: int = Field(ge=1)
    """Tokens per sequence s."""
    vocabulary: int = Field(ge=1)
    """Vocabulary size V."""
    micro_batch_size: int = Field(ge=1)
    """Sequences b one rank runs per micro-batch."""
    ffn_multiplier: int = Field(default=4, ge=1)
    """The MLP's inner size as a multiple of hidden."""
    attention: Attention = Attention.FUSED
    """fused (flash / scaled_dot_product_attention) or materialized scores."""
    dropout: bool = False
    """Whether the layers apply dropout (each dropout keeps a 1-byte mask per element for backward)."""


def _claim_rules(field: str, what: str, example: str) -> tuple[Rule, Rule]:
    """A read-only claim mounted at `path`: subPath needs the claim, and the mount point must be absolute."""
    return (
        Rule(
            "!has(self.subPath) || has(self.claimName)",
            lambda p: p.sub_path is None or p.claim_name is not None,
            f"{field}.subPath is a directory inside {field}.claimName; set claimName, or drop subPath and point path "
            f"at {what}",
            ("sub_path", "claim_name"),
        ),
        Rule(
            "!has(self.claimName) || self.path.startsWith('/')",
            lambda p: p.claim_name is None or p.path.startswith("/"),
            f"{field}.path is where the claim is mounted in the pods: use an absolute path such as {example}",
            ("path",),
        ),
    )


class PretrainedSpec(SpecModel):
    """Weights the job starts from instead of the model's own initialisation (fine-tuning). Each rank reads only
    the byte ranges of its own shard; names must match the model's exactly, up to one prefix (`model.` in the
    weights' names but not the model's, or the other way round: a model that wraps the pretrained one)."""

    rules = _claim_rules("pretrained", "the weights", "/pretrained")

    path: str = Field(min_length=1)
    """The weights as every rank sees them: a directory as Hugging Face writes it (`model.safetensors`, or
    `model.safetensors.index.json` and its shards; any floating dtype, converted into the fp32 master), one
    .safetensors file (a zerotrain export), or a zerotrain checkpoint (its root or a step-* directory: weights and
    buffers only). In a pod, `claimName` is mounted here read-only."""
    claim_name: str | None = None
    """PersistentVolumeClaim holding the weights, mounted read-only at `path` in every pod."""
    sub_path: str | None = None
    """The directory inside the claim that holds the weights (mounted at `path`); the claim's root without it."""
    new_parameters: list[str] = Field(default_factory=list, max_length=256)
    """Glob patterns of the model's parameters and buffers the weights do not hold, initialised by the model's own
    code instead (a fresh head for fine-tuning, `score.*`). Any other the weights lack is refused, naming both
    sides."""
    unused_keys: list[str] = Field(default_factory=list, max_length=256)
    """Glob patterns of tensors in the weights the model does not have, left unread (a head the model replaces).
    Any other is refused, naming both sides."""


class DataSpec(SpecModel):
    """Training data on a PersistentVolumeClaim, mounted read-only at `path` in every pod (locally, `path` is read
    as it is). The entry point names the files under it: the built-in Hugging Face entry point takes token files
    (`zerotrain data prepare` writes them) as entrypointArgs.train and eval, paths or globs under this path."""

    rules = _claim_rules("data", "the data", "/data")

    path: str = Field(min_length=1)
    """The data's directory as every rank sees it; in a pod, `claimName` is mounted here read-only."""
    claim_name: str | None = None
    """PersistentVolumeClaim holding the data, mounted read-only at `path` in every pod."""
    sub_path: str | None = None
    """The directory inside the claim that holds the data (mounted at `path`); the claim's root without it."""


class ModelInfo(SpecModel):
    """What the operator needs to know about the model to plan memory."""

    parameters: int | None = Field(default=None, ge=1)
    """Total parameter count Ψ; enables the memory plan at admission."""
    optimizer_multiplier: float | None = Field(default=None, gt=0)
    """K, optimizer-state bytes per parameter, stated outright; by default derived from training.optimizer and
    zero.precision (fp32 AdamW 8, mixed-precision AdamW 12 with the fp32 master, SGD 0 or 4, plus 4 when mixed)."""
    shape: ModelShape | None = None
    """The transformer's shape: the plan then counts activations, the stage-3 gathered units, the gradient arenas
    and the communication buffers, not only the model states."""
    activation_bytes: int | None = Field(default=None, ge=0)
    """Bytes one rank's micro-batch needs beyond parameters and gradients from its forward through its backward
    (saved activations plus backward's working set), as `zerotrain plan -f JOB --measure` prints it; replaces the
    shape's formula."""
    pretrained: PretrainedSpec | None = None
    """Weights to start from (fine-tuning): read into each rank's shard, never whole. A job that has a checkpoint
    of its own resumes from it instead (its frozen parameters, a LoRA job's base, are read from here again: the
    checkpoint holds what trains)."""
    lora: LoraSpec | None = None
    """Low-rank adapters (LoRA) on the frozen, sharded base: only they (and modulesToSave) train and are saved."""


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


class Toleration(SpecModel):
    """A Kubernetes toleration."""

    key: str | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: str = Field(default="Equal", pattern="^(Equal|Exists)$")
    """Equal or Exists."""
    value: str | None = None
    """Taint value for Equal."""
    effect: str | None = Field(default=None, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")
    """Taint effect to tolerate; empty means all."""
    toleration_seconds: int | None = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


class Scheduling(SpecModel):
    """Placement of the job's pods."""

    rules = (
        Rule(
            "!has(self.gang) || self.gang != 'volcano' || !has(self.schedulerName) || self.schedulerName == 'volcano'",
            lambda s: s.gang != GangMode.VOLCANO or s.scheduler_name in (None, "volcano"),
            "gang=volcano needs schedulerName volcano; drop schedulerName or set it to volcano",
            ("gang", "scheduler_name"),
        ),
    )

    scheduler_name: str | None = None
    """Scheduler of the pods (set automatically for gang modes when empty)."""
    priority_class_name: str | None = None
    """PriorityClass of the pods."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods require."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate."""
    gang: GangMode = GangMode.NONE
    """Gang scheduling: none, coscheduling (scheduler-plugins PodGroup) or volcano (Volcano PodGroup)."""
    startup_timeout_seconds: int = Field(default=600, ge=1)
    """A pod Pending longer than this is reported in the Unschedulable condition."""


class EnvVar(SpecModel):
    """An environment variable for every rank."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Variable name."""
    value: str = ""
    """Variable value."""


class VolumeMount(SpecModel):
    """A volume mounted into the training container."""

    name: str
    """Name of a volume in `volumes`."""
    mount_path: str
    """Path in the container."""
    read_only: bool = False
    """Mount read-only."""
    sub_path: str | None = None
    """Sub-path of the volume to mount."""


_REPLICAS = "(has(self.replicas) ? self.replicas : 1)"
_NPROC = "(has(self.nprocPerNode) ? self.nprocPerNode : 1)"
# True when shardGroupSize is not a count (unset or pod): the count rules then hold.
_NOT_A_GROUP_COUNT = "!has(self.zero) || !has(self.zero.shardGroupSize) || type(self.zero.shardGroupSize) != int"


class ZeroTrainingJobSpec(SpecModel):
    """Desired state of a ZeRO training job."""

    rules = (
        Rule(
            "!has(self.resources) || !has(self.resources.gpu) || self.resources.gpu == 0 || "
            "self.resources.gpu == (has(self.nprocPerNode) ? self.nprocPerNode : 1)",
            lambda s: s.resources.gpu in (0, s.nproc_per_node),
            "resources.gpu must equal nprocPerNode (one GPU per rank) or be 0 for CPU training",
            ("resources.gpu", "nproc_per_node"),
        ),
        Rule(
            "!has(self.zero) || !has(self.zero.stage) || type(self.zero.stage) == int || ("
            "has(self.model) && (has(self.model.parameters) || has(self.model.shape)) && has(self.resources) && ("
            "has(self.resources.memory) || (has(self.resources.gpuMemory) && has(self.resources.gpu) "
            "&& self.resources.gpu > 0)))",
            lambda s: (
                s.zero.stage is not AutoStage.AUTO
                or (
                    (s.model.parameters is not None or s.model.shape is not None)
                    and (s.resources.memory is not None or (s.resources.gpu_memory is not None and s.resources.gpu > 0))
                )
            ),
            "zero.stage: auto picks the lowest stage whose memory plan fits, which needs the model's size "
            "(model.parameters or model.shape) and each rank's memory (resources.gpuMemory with GPUs, "
            "resources.memory for CPU ranks); set them, or choose a stage 0-3",
            ("zero.stage", "model.parameters", "resources.gpu_memory", "resources.memory"),
        ),
        Rule(
            f"{_NOT_A_GROUP_COUNT} || ({_REPLICAS} * {_NPROC}) % self.zero.shardGroupSize == 0",
            lambda s: not isinstance(g := s.zero.shard_group_size, int) or s.world_size % g == 0,
            "zero.shardGroupSize must divide the world size (replicas × nprocPerNode): every group holds one whole "
            "copy of the model states; use a divisor, pod, or leave it unset",
            ("zero.shard_group_size", "replicas", "nproc_per_node"),
        ),
        Rule(
            f"{_NOT_A_GROUP_COUNT} || {_NPROC} % self.zero.shardGroupSize == 0 || "
            f"self.zero.shardGroupSize % {_NPROC} == 0",
            lambda s: (
                not isinstance(g := s.zero.shard_group_size, int)
                or s.nproc_per_node % g == 0
                or g % s.nproc_per_node == 0
            ),
            "zero.shardGroupSize splits a pod between two shard groups, so some groups' all-gathers cross the network "
            "and others' do not; use a divisor of nprocPerNode, a multiple of it (whole pods per group), or pod",
            ("zero.shard_group_size", "nproc_per_node"),
        ),
        Rule(
            f"!has(self.elastic) || {_NOT_A_GROUP_COUNT} || self.zero.shardGroupSize <= {_NPROC}",
            lambda s: s.elastic is None or not isinstance(g := s.zero.shard_group_size, int) or g <= s.nproc_per_node,
            "elastic with a shard group of several pods: the gang could resize to a pod count the group does not "
            "divide; use zero.shardGroupSize pod (or a divisor of nprocPerNode) with spec.elastic",
            ("zero.shard_group_size", "nproc_per_node"),
        ),
        Rule(
            "!has(self.zero) || !has(self.zero.offload) || !has(self.zero.offload.optimizer) || "
            "(has(self.resources) && has(self.resources.gpu) && self.resources.gpu > 0)",
            lambda s: s.zero.offload.optimizer is None or s.resources.gpu > 0,
            "zero.offload.optimizer moves optimizer states from the GPU to host memory, and these ranks train on the "
            "CPU (resources.gpu 0), where the states are in host memory already; drop zero.offload or give the ranks "
            "GPUs",
            ("zero.offload.optimizer", "resources.gpu"),
        ),
        Rule(
            # An inverted range is elastic's own rule's to refuse.
            "!has(self.elastic) || self.elastic.minReplicas > self.elastic.maxReplicas || ("
            "(has(self.replicas) ? self.replicas : 1) >= self.elastic.minReplicas && "
            "(has(self.replicas) ? self.replicas : 1) <= self.elastic.maxReplicas)",
            lambda s: (
                s.elastic is None
                or s.elastic.min_replicas > s.elastic.max_replicas
                or s.elastic.min_replicas <= s.replicas <= s.elastic.max_replicas
            ),
            "replicas is outside elastic [minReplicas, maxReplicas]; the gang starts at replicas, so set it "
            "between the bounds",
            ("replicas", "elastic.min_replicas", "elastic.max_replicas"),
        ),
        Rule(
            "!has(self.elastic) || !has(self.scheduling) || !has(self.scheduling.gang) || "
            "self.scheduling.gang == 'none'",
            lambda s: s.elastic is None or s.scheduling.gang == GangMode.NONE,
            "elastic needs scheduling.gang none: a gang scheduler binds no pod until minMember fit, so no smaller "
            "gang could ever be seen to fit; drop scheduling.gang or spec.elastic",
            ("scheduling.gang",),
        ),
        Rule(
            "!has(self.model) || !has(self.model.lora) || !self.entrypoint.endsWith('.py')",
            lambda s: s.model.lora is None or not s.entrypoint.endswith(".py"),
            "model.lora: a script entry point builds its own model, so the runtime cannot add adapters to it; use a "
            "`module:function` entry point returning a TrainingTask, or add the adapters in the script (peft) and "
            "drop model.lora",
            ("entrypoint",),
        ),
        Rule(
            "!has(self.elastic) || (has(self.checkpoint) && has(self.checkpoint.claimName))",
            lambda s: s.elastic is None or s.checkpoint.claim_name is not None,
            "elastic needs checkpoint.claimName: every resize restarts the gang from the newest checkpoint, which only "
            "a PersistentVolumeClaim keeps across pods; set checkpoint.claimName or drop spec.elastic",
            ("checkpoint.claim_name",),
        ),
    )

    image: str | None = Field(default=None, min_length=1)
    """Container image with zerotrain, torch and the entry point's code. Required on a cluster (the operator
    refuses a job without it); `zerotrain run` runs on this machine's Python and needs none."""
    entrypoint: str = Field(json_schema_extra=_IMMUTABLE)
    """`package.module:function` returning model, loss and data for a rank, or a script path ending in .py."""
    args: list[str] = Field(default_factory=list, json_schema_extra=_IMMUTABLE)
    """Arguments for a script entry point."""
    entrypoint_args: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Keyword arguments passed to a `module:function` entry point (model size, data, batch size...)."""
    replicas: int = Field(default=1, ge=1)
    """Pods (nodes) in the gang (where an elastic gang starts)."""
    elastic: ElasticSpec | None = None
    """Let the operator run the gang at another size between the bounds when it cannot be formed at its own
    (pods unschedulable, a node lost), and grow it back when capacity returns, resuming from the newest checkpoint;
    gradient accumulation keeps the global batch. Unset, the gang runs only at `replicas`."""
    nproc_per_node: int = Field(default=1, ge=1)
    """Ranks per pod; world size = replicas × nprocPerNode."""
    resources: Resources = Field(default_factory=Resources)
    """Per-pod resources."""
    zero: ZeroConfig = Field(default_factory=ZeroConfig)
    """The ZeRO runtime configuration."""
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Steps, optimizer and seed."""
    model: ModelInfo = Field(default_factory=ModelInfo, json_schema_extra=_IMMUTABLE)
    """Model facts for memory planning."""
    data: DataSpec | None = None
    """Training data on a volume every pod mounts read-only (token files for the built-in Hugging Face entry point).
    """
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, json_schema_extra=_IMMUTABLE)
    """Sharded checkpoints."""
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """Prometheus metrics of each rank."""
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    """Restarts and permanent failures."""
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Fail the job when it has run this long."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Delete the job this long after it succeeded or failed."""
    suspend: bool = False
    """Delete the pods but keep the job; setting it back to false resumes from the newest checkpoint."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """Pod placement."""
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment of every rank."""
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    """Extra pod volumes (Kubernetes Volume objects)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list)
    """Mounts of `volumes` into the training container."""
    pod_template: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A Kubernetes PodTemplateSpec (`metadata.labels`/`annotations`, `spec`) the operator builds every pod on:
    affinity, topologySpreadConstraints, tolerations, imagePullSecrets, serviceAccountName, securityContext, init
    and sidecar containers, extra volumes, and a container named `trainer` whose env (e.g. from Secrets),
    envFrom, volumeMounts and device-plugin resources (e.g. an RDMA device) are added to the training container.
    Fields the operator owns (the trainer's image, command, args, ports, cpu/memory/GPU resources and rendezvous env;
    restartPolicy, hostname, subdomain) are refused."""

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str) -> str:
        if not _ENTRYPOINT.match(v):
            raise ValueError("must be `package.module:function` or a script path ending in .py")
        return v

    @model_validator(mode="after")
    def _elastic_batch(self) -> ZeroTrainingJobSpec:
        # Not a Rule: whether some size in a range divides the batch is a loop CEL cannot write.
        if self.elastic is not None and self.elastic.min_replicas <= self.replicas <= self.elastic.max_replicas:
            problem = elastic_sizes.refusal(
                self.replicas, self.nproc_per_node, self.zero.gradient_accumulation_steps, self.elastic
            )
            if problem:
                raise ValueError(problem)
        return self

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.replicas * self.nproc_per_node

    @property
    def shard_group_ranks(self) -> int:
        """N of the memory plan at stages 1-3: the ranks each copy of the model states is sharded over
        (`zero.shardGroupSize`, else the world)."""
        return shard_group_ranks(self.zero.shard_group_size, self.world_size, self.nproc_per_node)


class ZeroTrainingJob(SpecModel):
    """A whole manifest."""

    api_version: str = Field(default=API_VERSION, pattern=f"^{re.escape(API_VERSION)}$")
    """Must be zerotrain.dev/v1alpha1."""
    kind: str = Field(default=KIND, pattern=f"^{KIND}$")
    """Must be ZeroTrainingJob."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Kubernetes object metadata."""
    spec: ZeroTrainingJobSpec
    """Desired state."""
    status: ZeroTrainingJobStatus | None = None
    """Observed state (written by the operator)."""
