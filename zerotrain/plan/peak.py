"""The whole per-rank peak: model states plus every buffer the zerotrain runtime keeps and each micro-batch's
activations. Pure arithmetic, torch-free; the runtime sizes its buffers with these same functions.

A step has two moments that can set the peak, on top of the model states and the buffers that persist (the
communication pool, the gradient arenas):

- forward through backward: activations (saved tensors and backward's working set), the stage-3 gathered window
  (the running unit, the units prefetched, the root, which stays gathered from forward into backward) and autograd's
  own unsharded gradients awaiting their reduction (without contiguous gradients, or of units larger than the reduce
  bucket, which the arenas do not serve);
- the optimizer step: the fp32 gradients mixed-precision stages 0/1 stage from reduction to step, and the
  optimizer's temporaries (torch's single-tensor AdamW holds three tensors the size of the view it updates; the
  foreach path, torch's default on CUDA, one per element of every view at once).

Not counted here, and stated wherever the plan is printed: the CUDA context, cuBLAS workspaces and NCCL's own
buffers (a fixed cost per GPU process, not from the model) and allocator fragmentation; the plan's headroom is
kept for them. The entry point's own tensors (a dataset held in memory) are not known to the plan either.
"""

from __future__ import annotations

from pydantic import Field

from zerotrain._model import SpecModel
from zerotrain.plan.model_states import PeakPlan, PlanInput, stage_bytes
from zerotrain.zero_config import GradientSync, Precision, Stage, ZeroConfig

ACROSS_GROUPS = "all_reduce_across_groups"
"""The op label of hybrid sharding's one collective between shard groups (`comm_report`, the plan, the metrics)."""
ALIGN = 16
"""Elements every parameter and every rank's shard starts at a multiple of (32 bytes in bf16, 64 in fp32: cuBLAS
and NCCL want at least 16-byte aligned pointers)."""
POOL_DEPTH = 2
"""Pooled communication buffers per dtype: one being filled while the other's collective is in flight."""
ARENA_DEPTH = 2
"""Gradient arenas for the block units: one receiving a unit's gradients while the other's are reduced."""
SINGLE_TENSOR_STEP_TEMPORARIES = 3
"""Tensors the size of one view torch's single-tensor Adam(W) allocates at once (the square root, its quotient,
the update); measured: tests/core/test_peak_plan.py."""


PRECISION_BYTES = {Precision.FP32: 4.0, Precision.BF16: 2.0, Precision.FP16: 2.0}
"""Bytes of one element of each precision."""


def align_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_elements(extent: int, world_size: int) -> int:
    """A unit's flat buffer: its elements rounded up so every rank's shard is equal and `ALIGN`-aligned."""
    return align_up(extent, world_size * ALIGN)


def chunk_width(world_size: int, bucket_elements: int) -> int:
    """Shard columns per chunk: as many as the bucket holds for every rank, a multiple of `ALIGN` when at least that
    many fit, so every row of a bucket and the chunk's output start aligned as the shards do."""
    width = max(1, bucket_elements // world_size)
    return width - width % ALIGN if width >= ALIGN else width


def chunk_capacity(largest_shard: int, world_size: int, bucket_elements: int) -> int:
    """Elements one pooled buffer needs: the largest chunk's bucket plus its output (N+1 columns per rank)."""
    return (world_size + 1) * min(chunk_width(world_size, bucket_elements), largest_shard)


class PeakInput(SpecModel):
    """What the whole-peak plan needs: the units as the runtime lays them out and the buffers' configuration."""

    stage: Stage
    """ZeRO stage."""
    world_size: int = Field(ge=1)
    """N: the ranks the model states are sharded over (the shard group's, with hybrid sharding)."""
    shard_groups: int = Field(default=1, ge=1)
    """Hybrid sharding: groups of N ranks, each holding a whole copy of the model states (1: plain ZeRO). Stage 0
    shards nothing: there N is the world and this is 1."""
    blocks: list[int] = Field(default_factory=list)
    """Padded elements of each block unit's flat buffer (the unit classes), in forward order: its trainable
    parameters (0 for a block whose parameters are all frozen)."""
    root: int = Field(default=0, ge=0)
    """Padded elements of the root unit (every parameter outside the unit classes); 0 if there is none."""
    frozen_blocks: list[int] = Field(default_factory=list)
    """Padded elements of each block's frozen twin (its frozen parameters: a LoRA job's base), in the order of
    `blocks`; empty when nothing is frozen. Weights only: no gradient, master or optimizer state."""
    frozen_root: int = Field(default=0, ge=0)
    """Padded elements of the root's frozen twin."""
    compute_bytes: float = Field(gt=0)
    """w: bytes of one element in the compute dtype."""
    gradient_bytes: float = Field(gt=0)
    """g: bytes per element of the gradients a stage holds between steps (`planner.element_bytes`)."""
    reduce_bytes: float = Field(gt=0)
    """Bytes of one element in the reduce dtype."""
    state_bytes: float = Field(ge=0)
    """K: optimizer state (and fp32 master, under mixed precision) bytes per parameter."""
    reduce_bucket_elements: int = Field(ge=1)
    """zero.reduceBucketElements."""
    allgather_bucket_elements: int = Field(ge=1)
    """zero.allgatherBucketElements."""
    prefetch_units: int = Field(default=1, ge=0)
    """zero.prefetchUnits (stage 3)."""
    contiguous_gradients: bool = True
    """zero.contiguousGradients (stages 2 and 3)."""
    accumulation_steps: int = Field(default=1, ge=1)
    """zero.gradientAccumulationSteps."""
    param_persistence_elements: int = Field(default=0, ge=0)
    """zero.paramPersistenceElements (stage 3): units this small stay gathered."""
    boundary_sync: bool = False
    """zero.gradientSync boundary: stages 2/3 reduce once per step instead of every micro-batch."""
    offload_optimizer: bool = False
    """zero.offload.optimizer: the step runs on the host, so its temporaries are not on the device."""
    offload_parameters: bool = False
    """zero.offload.parameters (stage 3): the parameter shard is in host memory; only the gathered window is on the
    device."""
    foreach_step: bool = False
    """Whether the optimizer steps every view at once (torch's default on CUDA) rather than one at a time."""
    activations: int = Field(default=0, ge=0)
    """Bytes a micro-batch needs at the start of its backward, beyond parameters and gradients (every saved tensor
    and the loss's gradients)."""
    activations_in_block: int | None = Field(default=None, ge=0)
    """The same while a block's backward runs (with checkpointing: its recomputed activations); None: as
    `activations` (a measured figure covers both)."""
    host_activations: int = Field(default=0, ge=0)
    """Bytes of checkpointed inputs offloaded to host memory (not on the device)."""


def config_fields(zero: ZeroConfig) -> dict[str, object]:
    """The `PeakInput` fields `spec.zero` decides, one mapping for the job spec's plan and the runtime's."""
    return {
        "stage": zero.fixed_stage,
        "reduce_bytes": PRECISION_BYTES[zero.reduce_dtype],
        "reduce_bucket_elements": zero.reduce_bucket_elements,
        "allgather_bucket_elements": zero.allgather_bucket_elements,
        "prefetch_units": zero.prefetch_units,
        "contiguous_gradients": zero.contiguous_gradients,
        "accumulation_steps": zero.gradient_accumulation_steps,
        "param_persistence_elements": zero.param_persistence_elements,
        "offload_optimizer": zero.offload.optimizer is not None,
        "offload_parameters": zero.offload.parameters is not None,
        "boundary_sync": zero.gradient_sync is GradientSync.BOUNDARY,
    }


def _local(stage: Stage, padded: int, n: int, sharded_from: Stage) -> int:
    return padded // n if stage >= sharded_from else padded


def pool_capacity(shards: list[int], world_size: int, reduce_bucket: int, allgather_bucket: int) -> int:
    """Elements of each pooled buffer: the largest chunk any unit's shard asks for, never more than a bucket needs
    (the runtime sizes its pool with this)."""
    bucket = max(reduce_bucket, allgather_bucket)
    return max(chunk_capacity(shard, world_size, bucket) for shard in shards)


def trainable_units(p: PeakInput) -> list[int]:
    """Padded elements of every unit with gradients (the blocks', then the root's)."""
    return [u for u in [*p.blocks, p.root] if u]


def frozen_units(p: PeakInput) -> list[int]:
    """Padded elements of every frozen twin."""
    return [u for u in [*p.frozen_blocks, p.frozen_root] if u]


def _pairs(p: PeakInput) -> list[int]:
    """Each block's units together (its trainable unit and its frozen twin): what stage 3 gathers for it."""
    frozen = p.frozen_blocks or [0] * len(p.blocks)
    return [b + f for b, f in zip(p.blocks, frozen, strict=True)]


def pool_bytes(p: PeakInput) -> int:
    """The communication pool: up to `POOL_DEPTH` buffers of the reduce dtype (one of the compute dtype for chunked
    stage 1/2 gathers), each as large as the largest chunk any unit asks for."""
    units = trainable_units(p)
    if not units:
        return 0
    n = p.world_size
    shards = [u // n for u in units + frozen_units(p)]
    capacity = pool_capacity(shards, n, p.reduce_bucket_elements, p.allgather_bucket_elements)
    if p.stage == Stage.DATA_PARALLEL:
        # All-reduced in place when the gradients already have the reduce dtype, else chunk by chunk.
        source = 4.0 if p.compute_bytes != 4.0 and p.accumulation_steps > 1 else p.compute_bytes
        if source == p.reduce_bytes:
            return 0
        chunks = sum(-(-u // capacity) for u in units)
        return int(min(POOL_DEPTH, chunks) * capacity * p.reduce_bytes)
    # The reduce-scatter's buckets, up to POOL_DEPTH in flight.
    width = chunk_width(n, p.reduce_bucket_elements)
    total = min(POOL_DEPTH, sum(-(-(u // n) // width) for u in units)) * capacity * p.reduce_bytes
    # Stages 1/2 gather a unit larger than the all-gather bucket chunk by chunk through one buffer (in place
    # otherwise); it is one of the reduce buffers when the dtypes agree.
    chunked = any(u // n > chunk_width(n, p.allgather_bucket_elements) for u in units)
    if p.stage < Stage.PARAMETERS and chunked and p.compute_bytes != p.reduce_bytes:
        total += capacity * p.compute_bytes
    return int(total)


def served(p: PeakInput, unit: int) -> bool:
    """Whether a unit's gradients land in an arena: contiguous gradients, and at most `reduceBucketElements`."""
    return p.contiguous_gradients and unit <= p.reduce_bucket_elements


def arena_bytes(p: PeakInput, kept: bool = True) -> int:
    """Stages 2/3: the root's arena and `ARENA_DEPTH` the size of the largest block, over the units the arenas serve
    (`kept`: held for the whole run); or over the others (autograd's gradients, alive only in backward)."""
    if p.stage < Stage.GRADIENTS:
        return 0
    largest = max((b for b in p.blocks if served(p, b) == kept), default=0)
    root = p.root if p.root and served(p, p.root) == kept else 0
    return int((ARENA_DEPTH * largest + root) * p.compute_bytes)


def gathered_bytes(p: PeakInput, running: bool = True) -> int:
    """Stage 3: the root plus the running unit (`running`) and the prefetched ones, the largest blocks at worst.
    When backward starts, the root runs and only the last block is prefetched."""
    if p.stage < Stage.PARAMETERS:
        return 0
    window = sorted(_pairs(p), reverse=True)[: int(running) + p.prefetch_units]
    return int((sum(window) + p.root + p.frozen_root) * p.compute_bytes)


def fp32_gradient_bytes(p: PeakInput) -> int:
    """Mixed-precision stages 0/1: the fp32 gradients between reduction and step."""
    if p.compute_bytes == 4.0 or p.stage >= Stage.GRADIENTS:
        return 0
    padded = sum(p.blocks) + p.root
    staged = 4 * _local(p.stage, padded, p.world_size, Stage.OPTIMIZER_STATES)
    if p.stage == Stage.OPTIMIZER_STATES and p.accumulation_steps > 1:
        staged += 4 * padded
    return staged


def step_bytes(p: PeakInput) -> int:
    """The optimizer's temporaries: fp32, the size of the views it updates (on the host under offload)."""
    if p.offload_optimizer and p.stage >= Stage.OPTIMIZER_STATES:
        return 0
    views = [_local(p.stage, u, p.world_size, Stage.OPTIMIZER_STATES) for u in [*p.blocks, p.root] if u]
    if not views:
        return 0
    return 4 * (sum(views) if p.foreach_step else SINGLE_TENSOR_STEP_TEMPORARIES * max(views))


def peak_plan(p: PeakInput) -> PeakPlan:
    """Every category at the rank's peak, and which moment of the step sets it."""
    padded = sum(p.blocks) + p.root
    frozen = sum(p.frozen_blocks) + p.frozen_root
    w, g, k = (
        round(b)
        for b in stage_bytes(
            p.stage,
            PlanInput(
                parameters=max(padded + frozen, 1),
                trainable_parameters=padded,
                data_parallel=p.world_size,
                optimizer_multiplier=p.state_bytes,
                # Only stage 3 has a parameter shard to offload (the other stages' rows keep theirs on the device).
                bytes_per_weight=0.0 if p.offload_parameters and p.stage == Stage.PARAMETERS else p.compute_bytes,
                bytes_per_gradient=p.gradient_bytes,
            ),
        )
    )
    pool, arenas, staged = pool_bytes(p), arena_bytes(p), fp32_gradient_bytes(p)
    transient = arena_bytes(p, kept=False)
    in_block = p.activations if p.activations_in_block is None else p.activations_in_block
    window = gathered_bytes(p)
    backward = max(gathered_bytes(p, running=False) + p.activations, window + in_block)
    backward += transient
    # fp32 gradients are staged from a unit's reduction to the step: they grow as backward frees activations, and
    # all of them are alive when the step starts.
    step = step_bytes(p) + staged
    persistent = w + g + k + pool + arenas
    return PeakPlan(
        parameters=w,
        gradients=g,
        optimizer=k,
        communication_buffers=pool,
        gradient_arenas=arenas,
        unsharded_gradients=transient,
        fp32_gradients=staged,
        gathered_parameters=window,
        activations=max(p.activations, in_block),
        optimizer_step=step,
        host_activations=p.host_activations,
        peak=persistent + max(backward, step),
        peak_phase="backward" if backward >= step else "step",
    )


def comm_bytes_per_step(p: PeakInput) -> dict[str, int]:
    """Bytes each rank's ZeRO collectives send per optimizer step, by op, in `comm_report()`'s ring convention (a
    full tensor of n bytes: all-gather and reduce-scatter send n·(N-1)/N, all-reduce twice that): the paper's 2Ψ and
    3Ψ made exact for the runtime. Stage 0 all-reduces, and stages 1/2 reduce-scatter, once per step; stages 2/3
    reduce-scatter every micro-batch (once with gradientSync boundary); stages 1/2 gather the updated parameters once;
    stage 3 gathers every unit in each forward and the blocks again in backward (the root stays gathered; a resident
    unit is gathered once, after the step). With hybrid sharding every op above runs inside a shard group of N, and
    `all_reduce_across_groups` is the one that leaves it: each shard all-reduced across the groups once per step. The
    small control collectives (step vote, order check) are not here."""
    n = p.world_size

    def ring(elements: int, nbytes: float) -> int:
        return int(elements * nbytes) * (n - 1) // n

    units = trainable_units(p)
    total, m = sum(units), p.accumulation_steps
    reduces = 1 if p.stage < Stage.GRADIENTS or p.boundary_sync else m
    if p.stage == Stage.DATA_PARALLEL:
        return {"all_reduce": 2 * ring(total, p.reduce_bytes)}
    out = {"reduce_scatter": reduces * ring(total, p.reduce_bytes)}
    r = p.shard_groups
    if r > 1:
        # The shard of each unit (chunk by chunk), averaged across the groups once per step.
        out[ACROSS_GROUPS] = sum(2 * int(u // n * p.reduce_bytes) * (r - 1) // r for u in units)
    if p.stage < Stage.PARAMETERS:
        out["all_gather"] = ring(total, p.compute_bytes)  # frozen twins are gathered once, as the engine starts
        return out
    persist = p.param_persistence_elements
    every = units + frozen_units(p)
    resident = [u for u in every if u <= persist]
    blocks = [b for b in [*p.blocks, *p.frozen_blocks] if b > persist]
    root = [u for u in (p.root, p.frozen_root) if u > persist]
    gathered = m * (sum(blocks) * 2 + sum(root)) + sum(resident)
    out["all_gather"] = ring(gathered, p.compute_bytes)
    return out
