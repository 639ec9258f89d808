"""What every unit of one engine shares: the stage as a policy, the dtypes, the communication pool and arenas.

The stage is not a class: it is which of ZeRO's three partitionings are on (`ShardPolicy`), and a unit reads them
where its lifecycle differs. FSDP2 keeps the same split: each `FSDPParamGroup` owns its parameters' lifecycle and
reads a shared communication context and mixed-precision policy.

| stage | held per rank                      | gradient reduction                          | after the step    |
|-------|------------------------------------|---------------------------------------------|-------------------|
| 0     | params, grads, opt state           | all-reduce at the accumulation boundary     | nothing           |
| 1     | params, grads, opt state / N       | reduce-scatter at the accumulation boundary | all-gather params |
| 2     | params, grads / N, opt state / N   | reduce-scatter every micro-batch, free      | all-gather params |
| 3     | params / N, grads / N, opt st. / N | reduce-scatter every micro-batch, free      | nothing           |

With hybrid sharding (`zero.shardGroupSize`), N is the shard group's size, every collective above runs inside the
group, and at the accumulation boundary each reduced shard is all-reduced (averaged) across the groups: the one
collective that leaves the group, once per step whatever the accumulation.

Averaging: on NCCL the collective averages itself (AVG, a pre-multiplied sum: each rank's values scaled by 1/N
before they are added, so an fp16 sum cannot overflow at 65,504), except in bf16 at a world size that is not a power
of two (`Comm.averages`). Otherwise, and on gloo, which has no AVG, ranks SUM and the result is divided by N
afterwards, or before the sum when the reduce dtype is fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zerotrain.plan.peak import pool_capacity
from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.zero_config import Stage


@dataclass(frozen=True)
class ShardPolicy:
    """Which model states a stage partitions over the ranks (the paper's P_os, P_g and P_p)."""

    optimizer: bool
    """The fp32 master and optimizer state: each rank steps only its shard (stages 1-3)."""
    gradients: bool
    """Gradients: reduce-scattered every micro-batch into the fp32 shard and dropped (stages 2 and 3)."""
    parameters: bool
    """Parameters: only the shard is held; a unit is gathered for its forward and backward (stage 3)."""

    @classmethod
    def of(cls, stage: Stage) -> ShardPolicy:
        return cls(
            optimizer=stage >= Stage.OPTIMIZER_STATES,
            gradients=stage >= Stage.GRADIENTS,
            parameters=stage >= Stage.PARAMETERS,
        )


@dataclass
class Dtypes:
    """Compute (parameters and their gradients) and reduction dtypes; masters are always fp32."""

    compute: torch.dtype
    reduce: torch.dtype


@dataclass
class UnitContext:
    """Resources and settings every unit of one engine shares."""

    comm: Comm
    """The shard group: every rank, or (hybrid sharding) the `zero.shardGroupSize` ranks sharing one copy."""
    dtypes: Dtypes
    policy: ShardPolicy
    pool: BucketPool
    """Two persistent fixed-size buffers per dtype that chunked collectives borrow (`buckets`)."""
    reduce_bucket: int
    """At most this many elements per reduce-scatter or all-reduce chunk (`reduceBucketElements`)."""
    allgather_bucket: int
    """At most this many elements per post-step all-gather chunk (`allgatherBucketElements`)."""
    accumulate_fp32: bool = False
    """Mixed precision over several micro-batches: full gradients are summed in fp32 until the step."""
    arenas: GradArenas | None = None
    """Contiguous gradients' arenas (stages 2 and 3 with contiguousGradients)."""
    offload: bool = False
    """zero.offload.optimizer: the fp32 master and optimizer state live in host memory and the step runs there."""
    offload_parameters: bool = False
    """zero.offload.parameters (stage 3): each unit's parameter shard lives in host memory; a gather first copies it
    into its slot of the device buffer."""
    across: Comm | None = None
    """Hybrid sharding: the ranks holding the same shard in the other groups, whose gradients are all-reduced with
    this rank's at the accumulation boundary; None when one group spans every rank."""
    gathered_live_bytes: int = 0
    """Stage 3: bytes of full parameter buffers allocated by gathers now."""
    gathered_peak_bytes: int = 0
    """Stage 3: the most `gathered_live_bytes` has been."""

    @property
    def n(self) -> int:
        return self.comm.world_size

    @property
    def mixed(self) -> bool:
        return self.dtypes.compute != torch.float32

    @property
    def own_master(self) -> bool:
        """The fp32 master is a buffer of its own (mixed precision, or offloaded), copied into the parameters after
        each step; otherwise the fp32 parameters are their own master."""
        return self.mixed or self.offload

    def divide_before_reduce(self, t: torch.Tensor, comm: Comm | None = None) -> None:
        """Before a mean over `comm` (the shard group unless given): fp16 is divided first, so its sum cannot
        overflow."""
        comm = comm or self.comm
        if self.dtypes.reduce == torch.float16 and comm.world_size > 1 and not comm.averages(t):
            t.div_(comm.world_size)

    def divide_after_reduce(self, t: torch.Tensor, comm: Comm | None = None) -> None:
        comm = comm or self.comm
        if self.dtypes.reduce != torch.float16 and comm.world_size > 1 and not comm.averages(t):
            t.div_(comm.world_size)

    def note_gathered(self, nbytes: int) -> None:
        """A gather allocated (`nbytes` > 0) or a free released (< 0) a full parameter buffer."""
        self.gathered_live_bytes += nbytes
        self.gathered_peak_bytes = max(self.gathered_peak_bytes, self.gathered_live_bytes)

    def size_pool(self, layouts: list[UnitLayout]) -> None:
        """Fix the pooled buffers' size: the largest chunk any unit asks for, never more than a bucket needs."""
        shards = [la.shard_numel for la in layouts]
        self.pool.capacity = pool_capacity(shards, self.n, self.reduce_bucket, self.allgather_bucket)
