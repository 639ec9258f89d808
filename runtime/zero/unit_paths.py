"""The paths one unit's values take, chosen once when the unit is built: where its fp32 master lives, how its
gradients are reduced, and how the step's result comes back into the compute parameters.

FSDP2 decides this once per `FSDPParamGroup` (its sharding strategy and mixed-precision policy fix which buffers
exist and which collective runs); a unit here does the same, so no method infers its stage from which buffer happens
to exist. Pure: a function of the shared context's settings (policy, dtypes, offload, buckets) and the layout.

| stage | master (fp32 compute)  | reduce                              | refresh after the step          |
|-------|------------------------|-------------------------------------|---------------------------------|
| 0     | its slot (the params)  | all-reduce the full gradients       | nothing (mixed: copy the master)|
| 1     | its slot of the params | reduce-scatter the full gradients   | all-gather from its slot        |
| 2     | its slot of the params | reduce-scatter each micro-batch     | all-gather from its slot        |
| 3     | the shard              | reduce-scatter each micro-batch     | the shard (gathered if resident)|

Mixed precision keeps the master on the device apart (`DEVICE_COPY`), optimizer offload on the host (`HOST_COPY`),
and a frozen unit keeps its compute-dtype values only (`FROZEN`). A unit larger than `allgatherBucketElements`
gathers in chunks; one within `reduceBucketElements` under contiguous gradients reduces from an arena.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from zerotrain.runtime.zero.buckets import chunks
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.runtime.zero.unit_context import UnitContext


class MasterPath(str, Enum):
    """Where the fp32 values the optimizer updates live."""

    SLOT = "slot"
    """fp32 compute, stages 0-2: this rank's slot of the full parameter buffer is the master (no second copy)."""
    SHARD = "shard"
    """fp32 compute, stage 3: the parameter shard is the master (on the host under parameter offload)."""
    DEVICE_COPY = "device_copy"
    """Mixed precision: an fp32 tensor of its own on the device, copied into the parameters after each step."""
    HOST_COPY = "host_copy"
    """Optimizer offload: an fp32 tensor in host memory, where the step runs, copied to the device after it."""
    FROZEN = "frozen"
    """A frozen unit: no master; the compute-dtype values this rank keeps stand in for it (what a checkpoint saves)."""

    @property
    def copied(self) -> bool:
        """The master is a tensor of its own, copied into the compute parameters after each step."""
        return self in (MasterPath.DEVICE_COPY, MasterPath.HOST_COPY)


class ReducePath(str, Enum):
    """How a unit's gradients reach the fp32 shard the optimizer reads."""

    NONE = "none"
    """A frozen unit: no gradients."""
    ALL_REDUCE_FULL = "all_reduce_full"
    """Stage 0: autograd accumulates into a flat full buffer, all-reduced at the accumulation boundary."""
    SCATTER_FULL = "scatter_full"
    """Stage 1: the flat full buffer (or its fp32 sum) reduce-scattered at the boundary."""
    SCATTER_ARENA = "scatter_arena"
    """Stages 2/3 under contiguous gradients: reduce-scattered every micro-batch from the unit's arena."""
    SCATTER_GRADS = "scatter_grads"
    """Stages 2/3: reduce-scattered every micro-batch from each parameter's `.grad`, then freed."""

    @property
    def full_buffer(self) -> bool:
        """Gradients accumulate in a flat full buffer held between steps (stages 0/1)."""
        return self in (ReducePath.ALL_REDUCE_FULL, ReducePath.SCATTER_FULL)


class RefreshPath(str, Enum):
    """How the step's new values reach the compute parameters (also after a checkpoint load)."""

    NONE = "none"
    """Stage 0 whose master is the parameters themselves."""
    COPY = "copy"
    """Stage 0 with a master of its own: copied into the full buffer."""
    GATHER_SLOT = "gather_slot"
    """Stages 1/2: one all-gather from this rank's slot of the full buffer, in place."""
    GATHER_CHUNKS = "gather_chunks"
    """Stages 1/2, a unit over `allgatherBucketElements`: all-gathered in chunks through the bucket pool."""
    SHARD = "shard"
    """Stage 3: the shard takes the new values; a resident unit that is gathered is gathered again."""


@dataclass(frozen=True)
class UnitPaths:
    """The three choices, fixed for the unit's life."""

    master: MasterPath
    reduce: ReducePath
    refresh: RefreshPath


def choose_paths(ctx: UnitContext, layout: UnitLayout) -> UnitPaths:
    """The unit's paths under the engine's settings (`ctx`, shared by every unit)."""
    master = _master(ctx, layout)
    return UnitPaths(master, _reduce(ctx, layout), _refresh(ctx, layout, master))


def _master(ctx: UnitContext, layout: UnitLayout) -> MasterPath:
    if layout.frozen:
        return MasterPath.FROZEN
    fp32, sharded = not ctx.mixed, ctx.policy.parameters
    if ctx.offload and not (sharded and ctx.offload_parameters and fp32):
        return MasterPath.HOST_COPY  # the offloaded fp32 shard is the host master itself: one host copy, not two
    if not fp32:
        return MasterPath.DEVICE_COPY
    return MasterPath.SHARD if sharded else MasterPath.SLOT


def _reduce(ctx: UnitContext, layout: UnitLayout) -> ReducePath:
    if layout.frozen:
        return ReducePath.NONE
    if not ctx.policy.gradients:
        return ReducePath.SCATTER_FULL if ctx.policy.optimizer else ReducePath.ALL_REDUCE_FULL
    if ctx.arenas is not None and ctx.arenas.serves(layout):
        return ReducePath.SCATTER_ARENA
    return ReducePath.SCATTER_GRADS


def _refresh(ctx: UnitContext, layout: UnitLayout, master: MasterPath) -> RefreshPath:
    if ctx.policy.parameters:
        return RefreshPath.SHARD
    if ctx.policy.optimizer:
        whole = len(chunks(layout.shard_numel, ctx.n, ctx.allgather_bucket)) <= 1
        return RefreshPath.GATHER_SLOT if whole else RefreshPath.GATHER_CHUNKS
    return RefreshPath.COPY if master.copied else RefreshPath.NONE
