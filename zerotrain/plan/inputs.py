"""From a job spec to the planner's input: one derivation for `zerotrain plan -f`, admission and the runtime.

Ψ, N and the device memory come from the spec; the bytes per element from its precision, stage and optimizer
(`planner.element_bytes`), unless `spec.model.optimizerMultiplier` states K outright. A Hugging Face model plans
from `spec.model.architecture` (what `zerotrain plan -f JOB --fill` writes from its config.json; locally the config
itself where the block is missing): Ψ and the units exact, the activations its family's own (`activations`).

With `spec.model.lora` the plan counts what LoRA makes of the units (`lora_config.sizes`): each block's adapters
train, its base is frozen (weights only), and the root's modulesToSave train; for the layouts known there (the
Hugging Face families counted, the built-in GPT of `spec.model.shape`). Where they are not known, every parameter
is counted as trained: more than the job will hold, never less.
"""

from __future__ import annotations

from zerotrain import architecture, lora_config
from zerotrain.plan import transformer as transformer_plan
from zerotrain.plan.activations import activation_bytes, job_architecture
from zerotrain.plan.model_states import (
    MemoryPlan,
    PlanInput,
    element_bytes,
    host_parameter_bytes,
    host_state_bytes,
    plan,
)
from zerotrain.plan.peak import PRECISION_BYTES, PeakInput, config_fields, padded_elements, peak_plan
from zerotrain.quantity import parse_bytes
from zerotrain.spec import OptimizerName, OptimizerSpec, ZeroTrainingJobSpec
from zerotrain.zero_config import Stage


def optimizer_state_bytes(opt: OptimizerSpec) -> float:
    """fp32 state bytes per element of the spec's optimizer (what torch keeps for fp32 parameters)."""
    if opt.name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        return 8.0  # exp_avg, exp_avg_sq
    return 4.0 if opt.momentum else 0.0  # SGD's momentum buffer


SHAPE_TOLERANCE = 0.01
"""How far `spec.model.parameters` may be from the shape's Ψ (the formula's architecture is assumed)."""


def model_units(spec: ZeroTrainingJobSpec) -> tuple[int, int, int] | None:
    """The units the whole-peak plan counts: (blocks, one block's parameters, the root's), from spec.model.shape
    (the GPT formula's counts) or a Hugging Face architecture (exact counts); None when neither is known."""
    shape = spec.model.shape
    if shape is not None:
        return shape.layers, transformer_plan.block_parameters(shape), transformer_plan.root_parameters(shape)
    a = job_architecture(spec)
    if a is None:
        return None
    return a.layers, architecture.block_parameters(a), architecture.root_parameters(a)


def _check_declared(declared: int | None, derived: int, what: str) -> None:
    if declared is not None and abs(declared - derived) > SHAPE_TOLERANCE * declared:
        raise ValueError(
            f"{what} has {derived:,} parameters, but spec.model.parameters is {declared:,}; fix one of them (or drop "
            "spec.model.parameters: the plan counts them)"
        )


def declared_parameters(spec: ZeroTrainingJobSpec) -> int | None:
    """Ψ: spec.model.parameters, else the shape's or the architecture's (a config's where it is readable); ValueError
    naming both when the parameters and the shape or architecture disagree beyond 1%."""
    shape, declared = spec.model.shape, spec.model.parameters
    if shape is not None:
        derived = transformer_plan.parameters(shape)
        _check_declared(
            declared,
            derived,
            f"spec.model.shape: a {shape.layers}-layer transformer of hidden {shape.hidden} and vocabulary "
            f"{shape.vocabulary}",
        )
        return declared if declared is not None else derived
    a = job_architecture(spec)
    if a is None:
        return declared
    derived = architecture.parameters(a)
    _check_declared(declared, derived, f"spec.model.architecture: a {a.layers}-layer {a.family.value}")
    return declared if declared is not None else derived


def lora_sizes(spec: ZeroTrainingJobSpec) -> lora_config.LoraSizes | None:
    """What spec.model.lora makes of the units (trainable and frozen per block and in the root), when the model's
    layers are known here; None without LoRA or when they are not."""
    lora, units = spec.model.lora, model_units(spec)
    if lora is None or units is None:
        return None
    blocks, block, root = units
    shape, a = spec.model.shape, job_architecture(spec)
    layers = None
    if shape is not None and spec.entrypoint == lora_config.GPT_ENTRYPOINT:
        layers = lora_config.gpt_layers(shape.hidden, shape.ffn_multiplier)
    elif shape is None and a is not None:
        layers = lora_config.hf_layers(a)
    return lora_config.sizes(lora, layers, blocks, block, root) if layers is not None else None


def planned_parameters(spec: ZeroTrainingJobSpec) -> tuple[int, int | None] | None:
    """(Ψ, Ψ_t) the model-state plan counts: every parameter, LoRA's adapters included, and those that train (None:
    all of them); None when Ψ is unknown."""
    psi = declared_parameters(spec)
    if psi is None:
        return None
    found = lora_sizes(spec)
    return (psi, None) if found is None else (found.parameters, found.trainable)


def _element_bytes(spec: ZeroTrainingJobSpec) -> tuple[float, float, float]:
    offload = spec.zero.offload.optimizer is not None
    w, g, k = element_bytes(
        spec.zero.fixed_stage,
        PRECISION_BYTES[spec.zero.precision],
        optimizer_state_bytes(spec.training.optimizer),
        offload,
        spec.zero.offload.parameters is not None,
    )
    if spec.model.optimizer_multiplier is not None and not offload:
        k = spec.model.optimizer_multiplier
    return w, g, k


def host_bytes_per_pod(spec: ZeroTrainingJobSpec) -> int:
    """Host memory a pod's ranks hold for offloaded model states: nprocPerNode × (K + 4)·Ψ/N, plus w·Ψ/N for an
    offloaded parameter shard in bf16/fp16 (0 without offload, or without Ψ)."""
    counted = planned_parameters(spec)
    offload = spec.zero.offload
    if offload.optimizer is None or counted is None:
        return 0
    psi, trainable = counted
    state = host_state_bytes(optimizer_state_bytes(spec.training.optimizer), True) * (
        psi if trainable is None else trainable
    )
    weights = host_parameter_bytes(PRECISION_BYTES[spec.zero.precision], offload.parameters is not None) * psi
    return round(spec.nproc_per_node * (state + weights) / spec.shard_group_ranks)


def plan_input(spec: ZeroTrainingJobSpec, device_memory: int | None = None) -> PlanInput:
    """The planner's input for `spec` (Ψ must be known: parameters or shape); `device_memory` in bytes, else the
    spec's gpuMemory."""
    counted = planned_parameters(spec)
    assert counted is not None, "spec.model.parameters (or spec.model.shape) is needed to plan"
    psi, trainable = counted
    w, g, k = _element_bytes(spec)
    if device_memory is None and spec.resources.gpu_memory:
        device_memory = gpu_memory_bytes(spec.resources.gpu_memory)
    return PlanInput(
        parameters=psi,
        trainable_parameters=trainable,
        data_parallel=spec.shard_group_ranks,
        optimizer_multiplier=k,
        bytes_per_weight=w,
        bytes_per_gradient=g,
        device_memory=device_memory,
    )


def gpu_memory_bytes(text: str) -> int:
    """A GPU memory quantity ("80Gi", "40G") in bytes; ValueError naming it when it is not one."""
    value = parse_bytes(text)
    if value is None or value < 1:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return value


def peak_input(spec: ZeroTrainingJobSpec, foreach_step: bool | None = None) -> PeakInput | None:
    """The whole-peak plan's input, when the spec gives the model's shape or a Hugging Face architecture (its units
    and, unless `spec.model.activationBytes` states them, its activations); None without either.
    `foreach_step`: whether the optimizer steps every view at once (by default: on GPUs, as torch does there)."""
    units = model_units(spec)
    if units is None:
        return None
    blocks, block, root = units
    declared_parameters(spec)
    z = spec.zero
    # Stage 0 shards nothing, so hybrid sharding changes nothing there: its N is the world (padding, all-reduce).
    n = spec.world_size if z.fixed_stage is Stage.DATA_PARALLEL else spec.shard_group_ranks
    _, g, k = _element_bytes(spec)
    w = PRECISION_BYTES[z.precision]  # the gathered window's and activations' dtype, offloaded shard or not
    if spec.model.activation_bytes is not None:
        acts, in_block, host = spec.model.activation_bytes, None, 0
    else:
        counted = activation_bytes(spec, spec.model.shape)
        assert counted is not None  # a shape or an architecture: model_units found one
        acts, in_block, host = counted
    units_of = {"blocks": [padded_elements(block, n)] * blocks, "root": padded_elements(root, n)}
    if (lora := lora_sizes(spec)) is not None:
        units_of = {
            "blocks": [padded_elements(lora.block_trainable, n)] * blocks,
            "root": padded_elements(lora.root_trainable, n),
            "frozen_blocks": [padded_elements(lora.block_frozen, n)] * blocks,
            "frozen_root": padded_elements(lora.root_frozen, n),
        }
    return PeakInput(
        **config_fields(z),
        world_size=n,
        shard_groups=spec.world_size // n,
        **units_of,
        compute_bytes=w,
        gradient_bytes=g,
        state_bytes=k,
        foreach_step=spec.resources.gpu > 0 if foreach_step is None else foreach_step,
        activations=acts,
        activations_in_block=in_block,
        host_activations=host,
    )


def at_stage(spec: ZeroTrainingJobSpec, stage: Stage, world_size: int | None = None) -> ZeroTrainingJobSpec:
    """The spec at another stage (and world size, as replicas of `nprocPerNode` ranks, sharded over all of them:
    what a rank holds at N is the same whether N is the world or a hybrid shard group)."""
    changed = spec.model_copy(update={"zero": spec.zero.model_copy(update={"stage": stage})})
    if world_size is not None:
        zero = changed.zero.model_copy(update={"shard_group_size": None})
        replicas = max(1, -(-world_size // spec.nproc_per_node))
        changed = changed.model_copy(update={"replicas": replicas, "zero": zero})
    return changed


def more_ranks(spec: ZeroTrainingJobSpec, ranks: int) -> str:
    """The fix that shards over at least `ranks` ranks (`min_world_size`): more replicas, or with hybrid sharding a
    larger shard group (more replicas alone add copies, not shards)."""
    replicas = -(-ranks // spec.nproc_per_node)
    if spec.zero.shard_group_size is None:
        return f"at least {replicas} replicas ({replicas * spec.nproc_per_node} ranks)"
    return f"a zero.shardGroupSize of at least {ranks} ranks ({replicas} pods or more per group)"


def memory_plan(spec: ZeroTrainingJobSpec, device_memory: int | None = None) -> MemoryPlan:
    """The job's plan, every stage: model states, and the whole peak when the spec gives the model's shape. The one
    entry point for `zerotrain plan -f`, `zerotrain validate` and the operator's admission."""
    p = plan_input(spec, device_memory)
    inputs = [plan_input(at_stage(spec, stage), device_memory) for stage in Stage]
    peaks = None
    if model_units(spec) is not None:
        peaks = []
        for stage in Stage:
            pi = peak_input(at_stage(spec, stage))
            assert pi is not None
            peaks.append(peak_plan(pi))
    result = plan(p, peaks, inputs, lowest_stage(spec))
    return result.model_copy(update={"host_state_bytes": host_bytes_per_pod(spec) // spec.nproc_per_node})


def lowest_stage(spec: ZeroTrainingJobSpec) -> Stage:
    """The lowest stage the job's offload can run at: 1 to offload the optimizer (a shard to step on the host), 3 to
    offload parameters (the only stage with a parameter shard); 0 without offload."""
    if spec.zero.offload.parameters is not None:
        return Stage.PARAMETERS
    return Stage.OPTIMIZER_STATES if spec.zero.offload.optimizer is not None else Stage.DATA_PARALLEL


def min_world_size(spec: ZeroTrainingJobSpec, stage: Stage, usable: int, limit: int = 1 << 16) -> int | None:
    """The fewest ranks at which `stage`'s whole peak fits `usable` bytes (a multiple of nprocPerNode), or None."""

    def fits(n: int) -> bool:
        pi = peak_input(at_stage(spec, stage, n))
        assert pi is not None
        return peak_plan(pi).peak <= usable

    n = spec.nproc_per_node
    while not fits(n):
        if n >= limit:
            return None
        n *= 2
    lo, hi = n // 2, n  # fits(hi); the smallest fitting multiple lies in (lo, hi]
    step = spec.nproc_per_node
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi
