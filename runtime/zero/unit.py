"""One partition unit: its buffers, its two lifecycles, and every operation that moves them.

A `Unit` is the one owner of its parameters' and gradients' lifecycle, as FSDP2's `FSDPParamGroup` is: it gathers,
frees, reduces and brings the step's result back, each by the path it chose once when built (`unit_paths`).
Hooks (`hooks`) decide *when*; the engine sequences the step; nothing else writes a unit's state.

Two explicit states, each changed only through `move_*`, which refuses a transition the lifecycle does not have
(a bug, named, instead of a silent wrong buffer):

    parameters   SHARDED ──gather issued──▶ GATHERING ──gather done──▶ GATHERED ──freed──▶ SHARDED
                 GATHERED ──step updated the shard──▶ STALE ──gather issued──▶ GATHERING   (stages 1/2 and
                 resident stage-3 units: the post-step gather runs while the next forward reaches the unit)

    gradients    IDLE ──backward starts──▶ ACCUMULATING ──all .grad in──▶ READY ──reduction issued──▶ REDUCING
                 REDUCING ──next backward──▶ ACCUMULATING;  any ──step (grads consumed)──▶ IDLE

Whether a unit is gathered is read from this state, never inferred from a storage's size.

Which buffers exist follows from the paths: a flat full gradient buffer at stages 0/1, an fp32 master of its own
in mixed precision or offload, a shard at stage 3; a frozen unit holds its values only and is never reduced. The
chunked collectives are in `unit_comm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn

from zerotrain.runtime.zero import unit_comm
from zerotrain.runtime.zero.collectives import Pending
from zerotrain.runtime.zero.flat_buffer import FlatBuffer, fill_rows
from zerotrain.runtime.zero.partition import ParamClass, Segment, UnitLayout
from zerotrain.runtime.zero.unit_context import UnitContext
from zerotrain.runtime.zero.unit_paths import MasterPath, ReducePath, RefreshPath, UnitPaths


class ParamState(str, Enum):
    """Where a unit's full parameters are."""

    SHARDED = "sharded"
    """Only this rank's shard is held (stage 3, between uses)."""
    GATHERING = "gathering"
    """An all-gather into the full buffer is in flight."""
    GATHERED = "gathered"
    """The full parameters are in the full buffer, usable."""
    STALE = "stale"
    """The step updated this rank's shard; the full buffer still holds the previous values."""


class GradState(str, Enum):
    """Where a unit's gradients are in one backward."""

    IDLE = "idle"
    """No backward since the last step."""
    ACCUMULATING = "accumulating"
    """Backward runs; some trainable parameters still wait for their gradient."""
    READY = "ready"
    """Every trainable parameter has its gradient for this micro-batch."""
    REDUCING = "reducing"
    """Its reduction is issued (in flight or done) for this micro-batch."""


_PARAM_MOVES: dict[ParamState, set[ParamState]] = {
    ParamState.SHARDED: {ParamState.GATHERING},
    ParamState.GATHERING: {ParamState.GATHERED},
    ParamState.GATHERED: {ParamState.SHARDED, ParamState.STALE},
    ParamState.STALE: {ParamState.GATHERING},
}
_GRAD_MOVES: dict[GradState, set[GradState]] = {
    GradState.IDLE: {GradState.ACCUMULATING, GradState.IDLE},
    GradState.ACCUMULATING: {GradState.READY, GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE},
    GradState.READY: {GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE},
    GradState.REDUCING: {GradState.ACCUMULATING, GradState.IDLE},
}
_TRAINABLE = (ParamClass.DECAY, ParamClass.NO_DECAY)


class LifecycleError(RuntimeError):
    """A unit was asked to move between states its lifecycle does not connect: a bug in the runtime."""


@dataclass(repr=False)  # the default repr reads every tensor field, and a sharded unit's storage is freed
class Unit:
    """Buffers, lifecycle states and per-backward bookkeeping of one unit, and the operations on them."""

    def __repr__(self) -> str:
        return f"Unit({self.index}, {self.layout.name!r}, {self.params_state.name}, {self.grads_state.name})"

    index: int
    layout: UnitLayout
    params: list[nn.Parameter]
    ctx: UnitContext
    paths: UnitPaths
    """Where the master lives, how gradients are reduced and parameters refreshed: chosen once (`unit_paths`)."""
    full: FlatBuffer
    """The full parameters in the compute dtype (allocated only while GATHERED or GATHERING in stage 3)."""
    master: torch.Tensor
    """The fp32 master values this rank updates (the whole unit in stage 0, its shard above)."""
    grad_shard: torch.Tensor
    """The fp32 gradients the optimizer reads, same range as `master`."""
    master_range: tuple[int, int]
    """Unit-coordinate range of `master`: the whole unit in stage 0, this rank's shard above."""
    shard: torch.Tensor | None = None
    """Stage 3: this rank's shard in the compute dtype, the source of every gather."""
    grad_full: FlatBuffer | None = None
    """Stages 0/1: the flat full gradients autograd accumulates into."""
    resident: bool = True
    """Stays gathered once gathered (stages 0-2; small stage-3 units)."""
    params_state: ParamState = ParamState.GATHERED
    grads_state: GradState = GradState.IDLE
    pending_gather: Pending | None = None
    grads_left: int = 0
    arena: torch.Tensor | None = None
    """Contiguous gradients: the arena slice this unit's `.grad` views point into during its backward."""
    unsharded_bytes: int = 0
    """Bytes of this unit's unsharded gradients counted live in the current backward."""
    accum: torch.Tensor | None = None
    """Stage 1, mixed precision, several micro-batches: the fp32 sum of the full gradients until the step."""
    host_grad: torch.Tensor | None = None
    """Optimizer offload: the host copy of `grad_shard` the optimizer steps with (`master` is on the host too)."""
    streamed: int = 0
    """Optimizer offload: elements of `host_grad` copied out as their reduction finished, this step."""

    @property
    def step_grads(self) -> torch.Tensor:
        """The fp32 gradients the optimizer reads: the shard, or its host copy under optimizer offload."""
        return self.host_grad if self.host_grad is not None else self.grad_shard

    def stream_out(self, a: int, b: int) -> None:
        """Optimizer offload: shard columns [a, b) hold their last reduction of the step: copy them out now, while
        backward still runs (queued on CUDA)."""
        if self.host_grad is not None:
            self.host_grad[a:b].copy_(self.grad_shard[a:b], non_blocking=True)
            self.streamed += b - a

    def offload_grads(self) -> None:
        """Before the host step: whatever of the reduced shard was not streamed out is copied now (queued on CUDA:
        the caller synchronizes once)."""
        if self.host_grad is not None and self.streamed < self.host_grad.numel():
            self.host_grad.copy_(self.fp32_grads(), non_blocking=True)
        self.streamed = 0

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def trainable_count(self) -> int:
        return sum(1 for p in self.params if p.requires_grad)

    @property
    def gathered(self) -> bool:
        return self.params_state is ParamState.GATHERED

    def move_params(self, to: ParamState) -> None:
        if to not in _PARAM_MOVES[self.params_state]:
            was = self.params_state.value
            raise LifecycleError(f"unit {self.name!r}: parameters cannot go from {was} to {to.value}")
        self.params_state = to

    def move_grads(self, to: GradState) -> None:
        if to not in _GRAD_MOVES[self.grads_state]:
            was = self.grads_state.value
            raise LifecycleError(f"unit {self.name!r}: gradients cannot go from {was} to {to.value}")
        self.grads_state = to

    # ----------------------------------------------------------------- parameters

    def unshard(self) -> bool:
        """Issue the asynchronous all-gather of a sharded unit (a no-op otherwise); True if issued."""
        if self.params_state is not ParamState.SHARDED:
            return False
        self.full.allocate()
        self.ctx.note_gathered(self.full.nbytes())
        self._issue_gather(self._device_shard(), async_op=True)
        return True

    def _device_shard(self) -> torch.Tensor:
        """Stage 3's gather source on the device: the shard, or under parameter offload its host values copied into
        this rank's slot of the full buffer (queued on CUDA: the gather is ordered after it), gathered in place."""
        assert self.shard is not None
        if not self.ctx.offload_parameters:
            return self.shard
        lo, hi = self.master_range
        slot = self.full.data[lo:hi]
        slot.copy_(self.shard, non_blocking=True)
        return slot

    def wait_for_unshard(self) -> None:
        """Wait for the unit's all-gather if one is in flight; its parameters are usable afterwards."""
        if self.params_state is ParamState.GATHERING:
            assert self.pending_gather is not None
            self.pending_gather.wait()
            self.pending_gather = None
            self.move_params(ParamState.GATHERED)

    def gather_now(self) -> None:
        """The full parameters, usable now: gathered if sharded, waited for if in flight."""
        self.unshard()
        self.wait_for_unshard()

    def reshard(self) -> None:
        """Free the full parameters of a non-resident unit (a gather still in flight is finished first)."""
        if self.resident or self.params_state is ParamState.SHARDED:
            return
        self.wait_for_unshard()  # a gather still in flight writes into the buffer
        self.ctx.note_gathered(-self.full.nbytes())
        self.full.free()
        self.move_params(ParamState.SHARDED)

    def _issue_gather(self, source: torch.Tensor, async_op: bool) -> None:
        self.pending_gather = self.ctx.comm.all_gather(self.full.data, source, self.name, async_op=async_op)
        self.move_params(ParamState.GATHERING)
        if not async_op:
            self.wait_for_unshard()

    def after_step(self, async_op: bool = False) -> None:
        """Bring the updated master values back into the compute parameters, by the unit's refresh path: stage 0
        copies (a master of its own); stages 1/2 all-gather the shards, a unit within `allgather_bucket` elements in
        place (its shard is already its slot of the full buffer) and asynchronously when asked (the next forward
        waits for it), a larger one in chunks through the pool; stage 3 updates the shard, and gathers a resident
        unit that is gathered."""
        copy, offload = self.paths.master.copied, self.ctx.offload
        match self.paths.refresh:
            case RefreshPath.NONE:
                pass
            case RefreshPath.COPY:
                self.full.data.copy_(self.master, non_blocking=offload)
            case RefreshPath.SHARD:
                assert self.shard is not None
                if copy:
                    self.shard.copy_(self.master, non_blocking=offload)  # from pinned host memory: queued on CUDA
                if self.resident and self.gathered:
                    self.move_params(ParamState.STALE)
                    self._issue_gather(self._device_shard(), async_op)
            case RefreshPath.GATHER_CHUNKS:
                unit_comm.gather_in_chunks(self)
            case RefreshPath.GATHER_SLOT:
                lo, hi = self.master_range
                mine = self.full.data[lo:hi]
                if copy:
                    mine.copy_(self.master, non_blocking=offload)
                self.move_params(ParamState.STALE)
                self._issue_gather(mine, async_op)

    def full_master(self) -> torch.Tensor:
        """The unit's whole fp32 master, a frozen unit's values in fp32 (a collective on every rank when the
        optimizer state is sharded)."""
        if not self.ctx.policy.optimizer:
            return self.master.float()
        device = self.full.data.device  # the group's device: an offloaded master is gathered from a device copy
        full = torch.empty(self.layout.padded, dtype=torch.float32, device=device)
        self.ctx.comm.all_gather(full, self.master.to(device, torch.float32), self.name)
        return full

    def optimizer_segments(self, rank: int) -> list[Segment]:
        """The trainable runs of `master` the optimizer steps, in unit coordinates."""
        if self.ctx.policy.optimizer:
            return self.layout.shard_segments(rank, _TRAINABLE)
        return [s for s in self.layout.class_segments() if s.kind in _TRAINABLE]

    # ----------------------------------------------------------------- gradients

    def fp32_grads(self) -> torch.Tensor:
        """The fp32 gradient shard, its storage allocated (stages 0/1 in mixed precision free it between steps)."""
        st = self.grad_shard.untyped_storage()
        if st.nbytes() == 0:
            st.resize_(self.grad_shard.numel() * self.grad_shard.element_size())
            self.grad_shard.zero_()
        return self.grad_shard

    def prepare_backward(self) -> None:
        """Stages 0/1: re-point `.grad` at the flat buffer if something (`model.zero_grad()`) dropped it. With
        arenas, the root unit's gradients accumulate over the whole backward: its arena is bound from the start."""
        if self.paths.reduce.full_buffer:
            if any(p.requires_grad and p.grad is None for p in self.params):
                self._grad_full.bind_grads(self.params)
        elif self.paths.reduce is ReducePath.SCATTER_ARENA and self.layout.module is None:
            assert self.ctx.arenas is not None
            self.ctx.arenas.bind(self)

    def unsharded_grad_bytes(self) -> int:
        """Bytes of the unit's unsharded gradients as they are once its backward is done."""
        if self.arena is not None:
            return self.arena.numel() * self.arena.element_size()
        if self.paths.reduce.full_buffer:
            return self._grad_full.nbytes()
        return sum(p.grad.numel() * p.grad.element_size() for p in self.params if p.grad is not None)

    def fold_into_fp32(self) -> torch.Tensor:
        """Add this micro-batch's compute-dtype gradients into the fp32 accumulator and clear them; returns the
        accumulator (stage 0: the fp32 gradient buffer itself, reduced in place at the boundary; stage 1: a
        full-size fp32 buffer held from the first micro-batch to the step)."""
        stage0 = self.paths.reduce is ReducePath.ALL_REDUCE_FULL
        acc = self.fp32_grads() if stage0 else self._full_accumulator()
        acc.add_(self._grad_full.data)
        self._grad_full.data.zero_()
        return acc

    @property
    def _grad_full(self) -> FlatBuffer:
        """The flat full gradients of a unit whose reduce path keeps them (stages 0/1)."""
        assert self.grad_full is not None, f"unit {self.name!r} reduces by {self.paths.reduce.value}: no full buffer"
        return self.grad_full

    def _full_accumulator(self) -> torch.Tensor:
        if self.accum is None:
            self.accum = torch.zeros(self.layout.padded, dtype=torch.float32, device=self.grad_shard.device)
        elif self.accum.untyped_storage().nbytes() == 0:
            self.accum.untyped_storage().resize_(self.layout.padded * 4)
            self.accum.zero_()
        return self.accum

    def end_backward(self, boundary: bool) -> None:
        """Between accumulation boundaries in mixed precision, full gradients are summed in fp32 (as the shards of
        stages 2/3 are), so micro-batches do not round in the compute dtype."""
        if self.paths.reduce.full_buffer and self.ctx.accumulate_fp32 and not boundary:
            self.fold_into_fp32()

    def reduce(self, async_op: bool, boundary: bool = True) -> int:
        """Launch the unit's gradient reduction by its reduce path; returns the bytes of unsharded gradients it
        dropped (stages 2/3).

        Stage 0 all-reduces and stage 1 reduce-scatters the full gradients (or their fp32 sum) at the boundary;
        stages 2/3 reduce-scatter this micro-batch's gradients, from the arena or from `.grad`, into the shard. With
        hybrid sharding the shard is averaged across the groups once, at the accumulation `boundary`."""
        path = self.paths.reduce
        if path is ReducePath.NONE:
            raise LifecycleError(f"unit {self.name!r} is frozen: it has no gradients to reduce")
        self.move_grads(GradState.REDUCING)
        if path.full_buffer:
            src = self.fold_into_fp32() if self.ctx.accumulate_fp32 else self._grad_full.data
            if path is ReducePath.ALL_REDUCE_FULL:
                unit_comm.all_reduce(self, src, async_op)
            else:
                unit_comm.reduce_scatter_full(self, src, async_op, boundary)
            return 0
        dropped, self.unsharded_bytes = self.unsharded_bytes, 0
        if path is ReducePath.SCATTER_ARENA:
            assert self.ctx.arenas is not None
            unit_comm.reduce_arena(self, self.ctx.arenas, async_op, boundary)
            return dropped
        pairs = zip(self.layout.slots, self.params, strict=True)
        grads = [(slot, p.grad.reshape(-1)) for slot, p in pairs if p.grad is not None]
        shard = self.layout.shard_numel

        def fill(rows: torch.Tensor, a: int, b: int) -> None:
            fill_rows(rows, grads, shard, a, b)

        unit_comm.reduce_scatter(self, fill, None, accumulate=True, async_op=async_op, boundary=boundary)
        for p in self.params:
            self.ctx.pool.streams.keep(p.grad)  # copied in on the side stream (CUDA): not reused before that
            p.grad = None  # the unsharded gradients are in the buckets now: free them
        return dropped

    def zero_grads(self) -> None:
        """The step consumed the gradients. Mixed precision keeps the full gradients in the compute dtype; the fp32
        copy the optimizer reads exists only from the reduction to the end of the step (as in DeepSpeed)."""
        if self.paths.reduce.full_buffer:
            self._grad_full.data.zero_()
            if self.accum is not None:
                self.accum.untyped_storage().resize_(0)
            if self.ctx.mixed:
                self.grad_shard.untyped_storage().resize_(0)
                self.move_grads(GradState.IDLE)
                return
        self.grad_shard.zero_()
        if self.host_grad is not None:
            self.host_grad.zero_()
        self.move_grads(GradState.IDLE)

    # What each buffer holds, by report category: the memory report sums these (each storage once).

    def parameter_tensors(self) -> list[torch.Tensor]:
        """Parameters held between steps: the shard (stage 3) or the full buffer."""
        return [self.shard if self.shard is not None else self.full.data]

    def gathered_tensors(self) -> list[torch.Tensor]:
        """Stage 3: the full buffer while gathered (a resident unit's too)."""
        return [self.full.data] if self.shard is not None else []

    def gradient_tensors(self) -> list[torch.Tensor | None]:
        """The flat full gradients (stages 0/1), the fp32 shard, and any `.grad` still alive."""
        held: list[torch.Tensor | None] = [self._grad_full.data] if self.paths.reduce.full_buffer else []
        return [*held, self.grad_shard, *(p.grad for p in self.params)]

    def master_tensors(self) -> list[torch.Tensor]:
        """The fp32 master (the parameters themselves under fp32 compute: then counted there, first); a frozen unit
        has none (its `master` is its parameters)."""
        return [] if self.paths.master is MasterPath.FROZEN else [self.master]
