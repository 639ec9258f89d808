"""The ZeRO configuration (`spec.zero` of a ZeroTrainingJob), which the engine runs.

Part of the torch-free core beside the spec it belongs to: the operator embeds this model in the CRD schema and the
planner reads it, and neither may import torch or any of the runtime.
"""

from __future__ import annotations

from enum import Enum, IntEnum

from pydantic import Field, field_validator

from zerotrain._model import Rule, SpecModel


class Stage(IntEnum):
    """ZeRO stage: what is partitioned across the data-parallel ranks."""

    DATA_PARALLEL = 0
    OPTIMIZER_STATES = 1
    GRADIENTS = 2
    PARAMETERS = 3


class AutoStage(str, Enum):
    """A stage chosen from the memory plan instead of written down."""

    AUTO = "auto"
    """The lowest stage whose whole-peak plan fits each rank's device (`zerotrain.plan.stage_choice`)."""


class Precision(str, Enum):
    """Floating-point format of a tensor class."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class DivergenceCheck(str, Enum):
    """When the ranks compare which units they ran (ZeRO's collectives are matched by issue order)."""

    STEP = "step"
    """Once per optimizer step, inside the step's control all-reduce that runs anyway: no extra collective; a
    divergence is caught before the update is applied."""
    EVERY_PASS = "every_pass"
    """Also at the end of every forward and backward (two small all-gathers per micro-batch): a divergence is
    caught before any gradient collective mixes up units."""
    OFF = "off"
    """Never (a divergence then shows as a collective timeout or a wrong result)."""


class GradientSync(str, Enum):
    """When stages 2 and 3 reduce-scatter gradients during gradient accumulation."""

    EVERY_MICRO_BATCH = "every_micro_batch"
    """After each micro-batch's backward, then free the unsharded gradients (least memory)."""
    BOUNDARY = "boundary"
    """Only at the accumulation boundary: unsharded gradients are kept and summed across micro-batches (as FSDP2's
    `set_requires_gradient_sync(False)`): one reduce-scatter per step instead of one per micro-batch, for the
    memory of the full gradients in the compute dtype."""


class ShardGroup(str, Enum):
    """A shard group named by where its ranks are rather than by a count."""

    POD = "pod"
    """The ranks of one pod (nprocPerNode): all-gathers and reduce-scatters stay on the node's own links."""


def shard_group_ranks(value: int | ShardGroup | None, world_size: int, ranks_per_pod: int) -> int:
    """S: how many ranks share each copy of the model states (unset: all of them, plain ZeRO; `pod`: one pod's).
    ValueError naming the field when S does not divide the world size."""
    size = world_size if value is None else ranks_per_pod if value is ShardGroup.POD else value
    if size < 1 or world_size % size:
        raise ValueError(
            f"zero.shardGroupSize: got {size}, which does not divide the world size {world_size}; use a divisor of "
            "it, pod (nprocPerNode ranks), or leave it unset to shard over every rank"
        )
    return size


class OffloadDevice(str, Enum):
    """Where offloaded model states live."""

    CPU = "cpu"
    """Host memory (pinned when the ranks train on GPUs, so copies to and from the device do not block the host)."""


class OffloadConfig(SpecModel):
    """Model states kept off the training device (ZeRO-Offload)."""

    optimizer: OffloadDevice | None = None
    """`cpu`: each rank's fp32 master shard and optimizer state live in host memory and the optimizer steps there
    (torch's own CPU optimizer on the same parameter groups); the reduced gradient shards are copied out for the step
    and the updated values copied back into the compute parameters. The device then holds no optimizer state and no
    master. Needs stage 1-3 (a shard to step)."""
    parameters: OffloadDevice | None = None
    """`cpu`: stage 3 also keeps each rank's parameter shard in host memory (ZeRO-Infinity's offload_param, FSDP2's
    CPUOffloadPolicy): a unit's gather first copies the shard into its slot of the device buffer (issued with the
    prefetch, so the copy runs ahead of the unit's compute), and the step writes the updated values into the host
    shard without touching the device. Between uses the device holds no parameters, only the gathered window.
    Needs stage 3 (below it every rank holds the full parameters) and optimizer: cpu (the step runs where the
    shard lives)."""


class LossScaleConfig(SpecModel):
    """Dynamic loss scaling, used only when `precision` is fp16."""

    initial_scale: float = Field(default=2.0**16, gt=0)
    """Loss scale at the first step."""
    growth_factor: float = Field(default=2.0, gt=1)
    """Factor the scale grows by after `growthInterval` steps without overflow."""
    backoff_factor: float = Field(default=0.5, gt=0, lt=1)
    """Factor the scale shrinks by on a step whose gradients overflowed (that step is skipped)."""
    growth_interval: int = Field(default=1000, ge=1)
    """Consecutive finite steps before the scale grows."""
    min_scale: float = Field(default=1.0, gt=0)
    """The scale never falls below this."""


class ZeroConfig(SpecModel):
    """How the ZeRO runtime partitions, communicates and saves memory."""

    rules = (
        Rule(
            "!has(self.offloadActivationCheckpoints) || !self.offloadActivationCheckpoints "
            "|| (has(self.activationCheckpointing) && self.activationCheckpointing)",
            lambda z: not z.offload_activation_checkpoints or z.activation_checkpointing,
            "offloadActivationCheckpoints needs activationCheckpointing; enable it or turn the offload off",
            ("offload_activation_checkpoints", "activation_checkpointing"),
        ),
        Rule(
            "!has(self.gradientSync) || self.gradientSync != 'boundary' || !has(self.precision) "
            "|| self.precision == 'fp32'",
            lambda z: z.gradient_sync is not GradientSync.BOUNDARY or z.precision is Precision.FP32,
            "gradientSync: boundary sums unsharded gradients across micro-batches in the compute dtype, where every "
            "stage sums them in fp32; use gradientSync: every_micro_batch with bf16 or fp16, or precision: fp32",
            ("gradient_sync", "precision"),
        ),
        Rule(
            "!has(self.offload) || !has(self.offload.optimizer) || !has(self.stage) || type(self.stage) != int "
            "|| self.stage != 0",
            lambda z: z.offload.optimizer is None or z.stage != Stage.DATA_PARALLEL,
            "offload.optimizer needs stage 1-3: each rank steps its shard of the optimizer state on the host, and "
            "stage 0 shards nothing; set zero.stage to 1-3 (or auto), or drop zero.offload",
            ("offload.optimizer", "stage"),
        ),
        Rule(
            "!has(self.offload) || !has(self.offload.parameters) || !has(self.stage) || type(self.stage) != int "
            "|| self.stage == 3",
            lambda z: z.offload.parameters is None or z.stage in (Stage.PARAMETERS, AutoStage.AUTO),
            "offload.parameters keeps each rank's parameter shard on the host, and only stage 3 shards parameters "
            "(below it every rank holds them all on the device); set zero.stage to 3 (or auto), or drop "
            "offload.parameters",
            ("offload.parameters", "stage"),
        ),
        Rule(
            "!has(self.offload) || !has(self.offload.parameters) || has(self.offload.optimizer)",
            lambda z: z.offload.parameters is None or z.offload.optimizer is not None,
            "offload.parameters needs offload.optimizer: cpu, so the step runs on the host where the parameter shard "
            "lives (a device step would copy every shard out and back each step); add optimizer: cpu to zero.offload",
            ("offload.parameters", "offload.optimizer"),
        ),
        Rule(
            "!has(self.partitionActivations) || !self.partitionActivations",
            lambda z: not z.partition_activations,
            "partitionActivations: ZeRO-R partitions activation checkpoints across a tensor-parallel group, and this "
            "runtime is data parallel only (each rank holds its own micro-batch's activations: nothing to "
            "partition); remove it, and use activationCheckpointing (and offloadActivationCheckpoints)",
            ("partition_activations",),
        ),
    )

    stage: Stage | AutoStage = Stage.PARAMETERS
    """ZeRO stage 0-3: 0 plain data parallel, 1 shards optimizer states, 2 also gradients, 3 also parameters; or
    auto: the lowest stage whose memory plan fits each rank's device, chosen before the ranks start (they always
    run a concrete stage; the job's status says which and why)."""
    unit_modules: list[str] = Field(default_factory=list)
    """Module class names that each form one partition unit (e.g. the transformer block class); every
    other parameter goes into the root unit. Stage 3 gathers one unit at a time."""
    precision: Precision = Precision.FP32
    """Compute dtype of forward and backward; master weights and optimizer state stay fp32."""
    reduce_dtype: Precision = Precision.FP32
    """Dtype gradients are reduced in."""
    loss_scale: LossScaleConfig = Field(default_factory=LossScaleConfig)
    """Dynamic loss scaling for fp16."""
    reduce_bucket_elements: int = Field(default=50_000_000, ge=1)
    """Elements per gradient-reduction bucket (a constant-size, reused buffer; ZeRO-R); also the largest unit whose
    gradients get a contiguous arena (contiguousGradients)."""
    allgather_bucket_elements: int = Field(default=50_000_000, ge=1)
    """Elements per parameter all-gather bucket for stages 1 and 2."""
    prefetch_units: int = Field(default=1, ge=0)
    """Stage 3: how many units ahead to start gathering asynchronously, so communication overlaps compute."""
    param_persistence_elements: int = Field(default=0, ge=0)
    """Stage 3: units with at most this many elements stay gathered (resident) instead of being freed."""
    overlap_comm: bool = True
    """Launch gradient reduction while backward still runs."""
    contiguous_gradients: bool = True
    """Stages 2/3: unsharded gradients land in reused arenas, units of at most reduceBucketElements (ZeRO-R memory
    defragmentation)."""
    activation_checkpointing: bool = False
    """Recompute each unit's activations in backward instead of storing them (ZeRO-R)."""
    offload_activation_checkpoints: bool = False
    """Keep checkpointed activations in host memory (ZeRO-R Pa+cpu); needs activationCheckpointing."""
    partition_activations: bool = False
    """Refused: ZeRO-R partitions activation checkpoints across a tensor-parallel group; this runtime is data
    parallel only, so each rank's activations are its own micro-batch's and there is nothing to partition. Use
    activationCheckpointing and offloadActivationCheckpoints to cut activation memory."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Micro-batches whose gradients are summed before one optimizer step."""
    gradient_clipping: float | None = Field(default=None, gt=0)
    """Clip the global gradient norm (over all shards) to this; null (the default, as in torch, DeepSpeed and
    FSDP) clips nothing, so the engine trains exactly as the optimizer it wraps. Recipes set it (e.g. 1.0)."""
    no_weight_decay: list[str] = Field(default_factory=list)
    """Parameter-name glob patterns that get no weight decay; none by default, as the wrapped optimizer would do.
    Recipes name their model's norms and biases (e.g. ["*.bias", "*norm*"]); check the patterns match the model's
    names (GPT-2 calls its norms ln_1, which "*norm*" misses)."""
    divergence_check: DivergenceCheck = DivergenceCheck.STEP
    """When the ranks check that they ran the same units in the same order: step (in the step's control all-reduce,
    no collective of its own; stage 3 also after each forward, asynchronously), every_pass (also after every forward
    and backward, before any gradient collective: two small all-gathers per micro-batch), or off."""
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH
    """Stages 2/3 with gradientAccumulationSteps > 1: every_micro_batch reduce-scatters and frees each micro-batch's
    gradients (least memory); boundary keeps them unsharded and reduce-scatters once per step (fewer collectives,
    the memory of full gradients; needs precision fp32)."""
    shard_group_size: int | ShardGroup | None = Field(
        default=None,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self >= 1 : self == 'pod'",
                    "message": "shardGroupSize is a positive number of ranks or 'pod'",
                }
            ]
        },
    )
    """Ranks each copy of the model states is sharded over (hybrid sharding, as FSDP2's HSDP and ZeRO++'s hpZ):
    parameters, gradients and optimizer state are sharded within each group of this many consecutive ranks and
    replicated across the groups; gradients are reduce-scattered inside the group, then all-reduced across groups
    shard by shard, so stage 3's per-unit all-gathers never leave the group. `pod` is one pod's nprocPerNode ranks
    (a node's fast links); unset, every rank (plain ZeRO). Must divide the world size; stage 0 shards nothing and
    ignores it. Each rank holds model states for S ranks' share, not the world's: memory is planned with S."""
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    """Model states kept in host memory instead of on the device (ZeRO-Offload): `optimizer: cpu`."""
    compile_units: bool = Field(default=False, alias="compile")
    """Compile each unit's forward with torch.compile (per block, as torchtitan does; the root unit stays eager),
    with the engine's hooks outside the compiled code, so it works with every stage, activation checkpointing and
    mixed precision. The first step pays the compile. A unit that cannot be captured whole runs eagerly, with one
    warning naming it and the break."""
    collective_timeout_seconds: int = Field(default=300, ge=1)
    """A collective not finished in this time fails with an error naming the rank and unit, never hangs."""
    broadcast_buffers: bool = True
    """Model buffers (BatchNorm's running statistics, counters: every buffer the model's state_dict holds) are
    broadcast from rank 0 before each forward, as DDP does by default, so every rank runs with rank 0's values and a
    checkpoint holds them once. false keeps each rank's own (each BatchNorm then follows its own rank's batches) and
    checkpoints every rank's. Non-persistent buffers are a module's derived state: never broadcast or saved."""

    @field_validator("stage", mode="before")
    @classmethod
    def _one_stage(cls, value: object) -> Stage | AutoStage:
        # One message for the union, instead of one per member type.
        if value == AutoStage.AUTO.value or value is AutoStage.AUTO:
            return AutoStage.AUTO
        if isinstance(value, int) and not isinstance(value, bool) and value in set(Stage):
            return Stage(value)
        raise ValueError("Input should be 0, 1, 2, 3 or 'auto'; set it to one of those")

    @field_validator("shard_group_size", mode="before")
    @classmethod
    def _one_group(cls, value: object) -> int | ShardGroup | None:
        if value is None:
            return None
        if value == ShardGroup.POD.value or value is ShardGroup.POD:
            return ShardGroup.POD
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError("Input should be a positive number of ranks or 'pod'; set one, or leave it unset")

    @property
    def fixed_stage(self) -> Stage:
        """The stage the ranks run; `auto` must have been resolved first
        (`zerotrain.plan.stage_choice.resolve_stage`)."""
        if isinstance(self.stage, AutoStage):
            raise ValueError(
                "spec.zero.stage: auto is chosen before the ranks start (by the operator, zerotrain run or "
                "zerotrain validate); give this process a concrete stage (0-3)"
            )
        return self.stage
