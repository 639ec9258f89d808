"""The ZeroTrainingJob resource (`zerotrain.dev/v1alpha1`) as pydantic models.

One source of truth: the operator validates manifests with these models, `zerotrain run` reads them,
and `zerotrain crd` generates the CRD's OpenAPI schema from them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from zerotrain import elastic as elastic_sizes
from zerotrain._model import Rule, SpecModel
from zerotrain.elastic import ElasticSpec
from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.model_spec import Attention, DataSpec, ModelInfo, ModelShape, PretrainedSpec
from zerotrain.pod_spec import EnvVar, GangMode, Resources, Scheduling, VolumeMount
from zerotrain.training_spec import (
    DEFAULT_CHECKPOINT_DIR,
    TERMINATION_MARGIN_SECONDS,
    CheckpointSpec,
    EvaluationSpec,
    FailurePolicy,
    LrDecay,
    LrSchedule,
    MetricsSpec,
    OptimizerName,
    OptimizerSpec,
    StragglerSpec,
    TrainingSpec,
)
from zerotrain.zero_config import AutoStage, ZeroConfig, shard_group_ranks

GROUP = "zerotrain.dev"
VERSION = "v1alpha1"
KIND = "ZeroTrainingJob"
PLURAL = "zerotrainingjobs"
SINGULAR = "zerotrainingjob"
SHORT_NAMES = ["ztj"]
API_VERSION = f"{GROUP}/{VERSION}"

# The spec's parts live by concern (model_spec, training_spec, pod_spec); the resource's readers import them here.
__all__ = [
    "API_VERSION",
    "DEFAULT_CHECKPOINT_DIR",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "TERMINATION_MARGIN_SECONDS",
    "VERSION",
    "Attention",
    "CheckpointSpec",
    "DataSpec",
    "EvaluationSpec",
    "GangMode",
    "LrDecay",
    "LrSchedule",
    "ModelShape",
    "OptimizerName",
    "OptimizerSpec",
    "PretrainedSpec",
    "StragglerSpec",
    "TrainingSpec",
    "ZeroTrainingJob",
    "ZeroTrainingJobSpec",
    "ZeroTrainingJobStatus",
]

_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$|^\S+\.py$")
# What a checkpoint was trained with: changing it under a running job would resume from incompatible state.
_IMMUTABLE: dict[str, Any] = {
    "x-kubernetes-validations": [
        {"rule": "self == oldSelf", "message": "is immutable (checkpoints depend on it); create a new job instead"}
    ]
}


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
            "has(self.model) && (has(self.model.parameters) || has(self.model.shape) || has(self.model.architecture)) "
            "&& has(self.resources) && ("
            "has(self.resources.memory) || (has(self.resources.gpuMemory) && has(self.resources.gpu) "
            "&& self.resources.gpu > 0)))",
            lambda s: (
                s.zero.stage is not AutoStage.AUTO
                or (
                    (s.model.parameters is not None or s.model.shape is not None or s.model.architecture is not None)
                    and (s.resources.memory is not None or (s.resources.gpu_memory is not None and s.resources.gpu > 0))
                )
            ),
            "zero.stage: auto picks the lowest stage whose memory plan fits, which needs the model's size "
            "(model.architecture, which `zerotrain plan -f JOB --fill` writes from a Hugging Face config.json; or "
            "model.parameters or model.shape) and each rank's memory (resources.gpuMemory with GPUs, "
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
    stragglers: StragglerSpec = Field(default_factory=StragglerSpec)
    """Name the rank that holds the gang back, and whether its input or its compute does."""
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
