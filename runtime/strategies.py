"""One small class per ZeRO stage, saying only what differs: what is held, how gradients are reduced,
and how updated parameters get back to every rank.

| stage | held per rank                      | gradient reduction                          | after the step    |
|-------|------------------------------------|---------------------------------------------|-------------------|
| 0     | params, grads, opt state           | all-reduce at the accumulation boundary     | nothing           |
| 1     | params, grads, opt state / N       | reduce-scatter at the accumulation boundary | all-gather params |
| 2     | params, grads / N, opt state / N   | reduce-scatter every micro-batch, free      | all-gather params |
| 3     | params / N, grads / N, opt st. / N | reduce-scatter every micro-batch, free      | nothing           |

The stage 1/2 all-gather after the step runs in place (each rank's shard is its slot of the full buffer) and, with
`overlapComm`, asynchronously: the next forward waits for each unit just before running it, so the gathers of
later units overlap the compute of earlier ones.

Stages 0 and 1 let autograd accumulate straight into a flat gradient buffer (`.grad` are views) and
communicate once per optimizer step; stages 2 and 3 cannot hold full gradients, so every micro-batch
is reduce-scattered into the fp32 gradient shard and the unsharded gradients are dropped.

Reduce-scatters, the stage 1/2 all-gathers of units larger than `allgatherBucketElements` and stage 0's
all-reduce under mixed precision run in chunks through `buckets` (at most `reduceBucketElements` /
`allgatherBucketElements` per chunk, two persistent fixed-size buffers per dtype, allocated once); stage 0's
all-reduce in the compute dtype works in place on the flat gradient buffer, and the other gathers go straight into
the unit's own parameter buffer (that memory is the gathered parameters, not a communication buffer).

Averaging: on NCCL the collective averages itself (AVG, a pre-multiplied sum: each rank's values scaled by 1/N
before they are added, so an fp16 sum cannot overflow at 65,504), except in bf16 at a world size that is not a power
of two (`Comm.averages`). Otherwise, and on gloo, which has no AVG, ranks SUM and the result is divided by N
afterwards, or before the sum when the reduce dtype is fp16.

Streams (`streams`): each chunk's copy into its bucket, the pre-divide and the collective's launch are one piece of
side-stream work; results are applied on the compute stream after it waited for that work, and memory the copy
reads (a gradient arena) is zeroed for the next unit only after the same wait.
With fp32 compute the fp32 master is the parameter storage itself (no second copy is held).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from zerotrain.peak import pool_capacity
from zerotrain.runtime.buckets import BucketPool, chunks
from zerotrain.runtime.collectives import Comm, Pending
from zerotrain.runtime.flat_buffer import FlatBuffer, fill_rows
from zerotrain.runtime.grad_arena import GradArenas
from zerotrain.runtime.partition import UnitLayout
from zerotrain.runtime.streams import SideWork
from zerotrain.runtime.unit import ParamState, UnitState
from zerotrain.zero_config import Stage


@dataclass
class Dtypes:
    """Compute (parameters and their gradients) and reduction dtypes; masters are always fp32."""

    compute: torch.dtype
    reduce: torch.dtype


class Strategy:
    """Stage 0: plain data parallelism."""

    stage = Stage.DATA_PARALLEL
    shards_optimizer = False
    reduce_every_micro_batch = False
    keeps_full_params = True
    """Full parameters stay allocated between steps (stages 0-2)."""
    keeps_full_grads = True
    """Full gradients stay in a flat buffer until the step (stages 0/1)."""
    arenas: GradArenas | None = None
    """Contiguous gradients' arenas (stages 2 and 3 with contiguousGradients)."""

    def __init__(self, comm: Comm, dtypes: Dtypes, reduce_bucket: int, allgather_bucket: int) -> None:
        self.comm, self.dtypes = comm, dtypes
        self.n = comm.world_size
        self.reduce_bucket, self.allgather_bucket = reduce_bucket, allgather_bucket
        self.pool = BucketPool(comm)

    @property
    def _mixed(self) -> bool:
        return self.dtypes.compute != torch.float32

    def build(self, index: int, layout: UnitLayout, params: list[nn.Parameter], init: torch.Tensor) -> UnitState:
        """Buffers of one unit, from `init` (its fp32 flat values, identical on every rank); what differs by stage
        is read from the class's two facts: whether it keeps full parameters and full gradients between steps."""
        full = FlatBuffer(layout, self.dtypes.compute, init.device)
        full.bind(params)
        lo, hi = self.master_range(layout)
        shard = None
        if self.keeps_full_params:
            full.data.copy_(init)
            held = full.data[lo:hi]
        else:
            shard = held = init[lo:hi].to(self.dtypes.compute, copy=True)
            full.free()
        grad_full = None
        if self.keeps_full_grads:
            grad_full = FlatBuffer(layout, self.dtypes.compute, init.device)
            grad_full.bind_grads(params)
        master = init[lo:hi].clone() if self._mixed else held
        grad_shard = grad_full.data[lo:hi] if grad_full is not None and not self._mixed else torch.zeros_like(master)
        state = ParamState.GATHERED if self.keeps_full_params else ParamState.SHARDED
        return UnitState(
            index, layout, params, full, master, grad_shard, shard, grad_full, self.keeps_full_params, state
        )

    def _fp32_grads(self, u: UnitState) -> torch.Tensor:
        """The fp32 gradient shard, its storage allocated (stages 0/1 in mixed precision free it between steps)."""
        st = u.grad_shard.untyped_storage()
        if st.nbytes() == 0:
            st.resize_(u.grad_shard.numel() * u.grad_shard.element_size())
            u.grad_shard.zero_()
        return u.grad_shard

    def master_range(self, layout: UnitLayout) -> tuple[int, int]:
        """Unit-coordinate range whose fp32 master this rank holds: all of it in stage 0, its shard above."""
        return (0, layout.padded) if not self.shards_optimizer else layout.shard_range(self.comm.rank)

    def _divide_before_reduce(self, t: torch.Tensor) -> None:
        if self.dtypes.reduce == torch.float16 and self.n > 1 and not self.comm.averages(t):
            t.div_(self.n)

    def _divide_after_reduce(self, t: torch.Tensor) -> None:
        if self.dtypes.reduce != torch.float16 and self.n > 1 and not self.comm.averages(t):
            t.div_(self.n)

    def enable_arenas(self, layouts: list[UnitLayout], device: torch.device) -> None:
        """Contiguous gradients: unsharded gradients in reused arenas (see `grad_arena`)."""
        self.arenas = GradArenas(layouts, self.dtypes.compute, device, self.pool, self.reduce_bucket)

    def size_pool(self, layouts: list[UnitLayout]) -> None:
        """Fix the pooled buffers' size: the largest chunk any unit asks for, never more than a bucket needs."""
        shards = [la.shard_numel for la in layouts]
        self.pool.capacity = pool_capacity(shards, self.n, self.reduce_bucket, self.allgather_bucket)

    # Mixed precision with several micro-batches per step: accumulate them in fp32 (as stages 2/3 do), set by
    # the engine from the configuration.
    accumulate_fp32 = False

    def fold_into_fp32(self, u: UnitState) -> torch.Tensor:
        """Add this micro-batch's compute-dtype gradients into the fp32 accumulator and clear them; the
        accumulator (stage 0: the fp32 gradient buffer itself, reduced in place at the boundary)."""
        assert u.grad_full is not None
        acc = self._accumulator(u)
        acc.add_(u.grad_full.data)
        u.grad_full.data.zero_()
        return acc

    def _accumulator(self, u: UnitState) -> torch.Tensor:
        return self._fp32_grads(u)

    def _reduce_source(self, u: UnitState) -> torch.Tensor:
        """What the boundary reduction sends: the flat gradients, or their fp32 accumulation."""
        assert u.grad_full is not None
        return self.fold_into_fp32(u) if self.accumulate_fp32 else u.grad_full.data

    def reduce(self, u: UnitState, async_op: bool) -> None:
        """Launch the unit's gradient all-reduce (at the accumulation boundary only): in place when the
        gradients already have the reduce dtype, else chunk by chunk through the pool's fixed buffers."""
        src = self._reduce_source(u)
        if src.dtype == self.dtypes.reduce:

            def send() -> Pending:
                self._divide_before_reduce(src)
                return self.comm.all_reduce(src, u.name, async_op=True, mean=True)

            def finish_in_place() -> None:
                self._divide_after_reduce(src)
                if src.data_ptr() != u.grad_shard.data_ptr():
                    self._fp32_grads(u).copy_(src)

            self.pool.launch(send, finish_in_place, None)
        else:
            for a in range(0, src.numel(), self.pool.capacity):
                b = min(a + self.pool.capacity, src.numel())
                buf = self.pool.acquire(b - a, self.dtypes.reduce, src.device)

                def send_chunk(buf: torch.Tensor = buf, a: int = a, b: int = b) -> Pending:
                    buf.copy_(src[a:b])
                    self._divide_before_reduce(buf)
                    return self.comm.all_reduce(buf, u.name, async_op=True, mean=True)

                self.pool.launch(send_chunk, self._apply_all_reduced(u, buf, a, b), buf)
        if not async_op:
            self.pool.drain()

    def _apply_all_reduced(self, u: UnitState, buf: torch.Tensor, a: int, b: int) -> Callable[[], None]:
        def finish() -> None:
            self._divide_after_reduce(buf)
            self._fp32_grads(u)[a:b].copy_(buf)

        return finish

    def prepare_backward(self, u: UnitState) -> None:
        """Re-point `.grad` at the flat buffer if something (e.g. `model.zero_grad()`) dropped it."""
        if u.grad_full is not None and any(p.requires_grad and p.grad is None for p in u.params):
            u.grad_full.bind_grads(u.params)

    def drain(self) -> None:
        """Wait for every reduction launched and apply its result."""
        self.pool.drain()

    def zero_grads(self, u: UnitState) -> None:
        if u.grad_full is not None:
            u.grad_full.data.zero_()
            if self._mixed:
                # Mixed precision keeps the full gradients in the compute dtype; the fp32 copy the optimizer
                # reads exists only from the reduction to the end of the step (as in DeepSpeed).
                u.grad_shard.untyped_storage().resize_(0)
                return
        u.grad_shard.zero_()

    def _gather_again(self, u: UnitState, source: torch.Tensor, async_op: bool) -> None:
        """The step changed the shard under a gathered unit: gather it whole again from `source` (asynchronously:
        the unit's next use waits for it)."""
        u.move_params(ParamState.SHARDED)
        u.gather = self.comm.all_gather(u.full.data, source, u.name, async_op=async_op)
        u.move_params(ParamState.GATHERING)
        if not async_op:
            u.finish_gather()

    def after_step(self, u: UnitState, async_op: bool = False) -> None:
        """Bring the updated master values back into the compute parameters."""
        if self._mixed:
            u.full.data.copy_(u.master)


class OptimizerStatesStrategy(Strategy):
    """Stage 1: each rank steps only its shard; one reduce-scatter per optimizer step, then all-gather."""

    stage = Stage.OPTIMIZER_STATES
    shards_optimizer = True

    def _accumulator(self, u: UnitState) -> torch.Tensor:
        # Full-size fp32, only from the first micro-batch to the step (the fp32 gradients kept are the shard).
        if u.accum is None:
            u.accum = torch.zeros(u.layout.padded, dtype=torch.float32, device=u.grad_shard.device)
        elif u.accum.untyped_storage().nbytes() == 0:
            u.accum.untyped_storage().resize_(u.layout.padded * 4)
            u.accum.zero_()
        return u.accum

    def zero_grads(self, u: UnitState) -> None:
        super().zero_grads(u)
        if u.accum is not None:
            u.accum.untyped_storage().resize_(0)

    def reduce(self, u: UnitState, async_op: bool) -> None:
        src = self._reduce_source(u)
        rows_of = src.view(self.n, -1)

        def fill(rows: torch.Tensor, a: int, b: int) -> None:
            rows.copy_(rows_of[:, a:b])

        direct = src if src.dtype == self.dtypes.reduce else None
        self._reduce_scatter(u, fill, direct, accumulate=False, async_op=async_op)

    def _reduce_scatter(
        self,
        u: UnitState,
        fill: Callable[[torch.Tensor, int, int], None],
        direct: torch.Tensor | None,
        accumulate: bool,
        async_op: bool,
        then: Callable[[], None] | None = None,
    ) -> SideWork[Pending] | None:
        """Reduce-scatter the unit chunk by chunk; `fill(rows, a, b)` writes every rank's columns [a, b).

        `direct`, a flat buffer already holding the whole unit in the reduce dtype, is sent as it is
        when one chunk covers the unit (no copy, no bucket); then it is read until the collective finishes,
        after which `then` runs, and None is returned. Otherwise the ticket of the last copy-in is returned: the
        gradients `fill` reads may be overwritten only after the compute stream waited for it.
        """
        shard = u.layout.shard_numel
        ranges = chunks(shard, self.n, self.reduce_bucket)
        device = u.grad_shard.device
        last: SideWork[Pending] | None = None
        for a, b in ranges:
            width = b - a
            whole = direct if len(ranges) == 1 else None
            if whole is not None:
                lent = self.pool.acquire(width, self.dtypes.reduce, device)
                bucket, out = whole, lent
            else:
                # One pooled buffer holds the chunk's bucket (N columns) and its output (one more).
                lent = self.pool.acquire((self.n + 1) * width, self.dtypes.reduce, device)
                bucket, out = lent[: self.n * width], lent[self.n * width :]

            def send(
                bucket: torch.Tensor = bucket,
                out: torch.Tensor = out,
                copy: bool = whole is None,
                a: int = a,
                b: int = b,
            ) -> Pending:
                if copy:
                    fill(bucket.view(self.n, b - a), a, b)
                self._divide_before_reduce(bucket)
                return self.comm.reduce_scatter(out, bucket, u.name, async_op=True, mean=True)

            finish = self._apply(u, out, a, b, accumulate)
            if whole is not None and then is not None:
                finish = _chain(finish, then)
            ticket = self.pool.launch(send, finish, lent)
            if whole is None:
                last = ticket
        if not async_op:
            self.pool.drain()
        return last

    def _apply(self, u: UnitState, out: torch.Tensor, a: int, b: int, accumulate: bool) -> Callable[[], None]:
        def finish() -> None:
            self._divide_after_reduce(out)
            if accumulate:
                u.grad_shard[a:b].add_(out)
            else:
                self._fp32_grads(u)[a:b].copy_(out)

        return finish

    def after_step(self, u: UnitState, async_op: bool = False) -> None:
        """All-gather the updated shards: a unit within `allgather_bucket` elements in place (its shard is already
        its slot of the full buffer), asynchronously when asked (the next forward waits for it); a larger one in
        chunks through the pool's constant-size buffers."""
        shard = u.layout.shard_numel
        ranges = chunks(shard, self.n, self.allgather_bucket)
        if len(ranges) == 1:
            lo, hi = self.master_range(u.layout)
            mine = u.full.data[lo:hi]
            if self._mixed:
                mine.copy_(u.master)
            self._gather_again(u, mine, async_op)
            return
        for a, b in ranges:
            width = b - a
            lent = self.pool.acquire((self.n + 1) * width, self.dtypes.compute, u.master.device)
            recv, send = lent[: self.n * width], lent[self.n * width :]
            send.copy_(u.master[a:b])
            self.comm.all_gather(recv, send, u.name)
            u.full.data.view(self.n, shard)[:, a:b].copy_(recv.view(self.n, width))
            self.pool.give_back(lent)
        self.pool.drain()


class GradientsStrategy(OptimizerStatesStrategy):
    """Stage 2: gradients are reduce-scattered every micro-batch into the fp32 shard and dropped."""

    stage = Stage.GRADIENTS
    reduce_every_micro_batch = True
    keeps_full_grads = False

    def prepare_backward(self, u: UnitState) -> None:
        # The root unit's gradients accumulate over the whole backward: its arena is bound from the start.
        if self.arenas is not None and u.layout.module is None:
            self.arenas.bind(u)

    def reduce(self, u: UnitState, async_op: bool) -> None:
        if self.arenas is not None and self.arenas.serves(u):
            self._reduce_arena(u, self.arenas, async_op)
            return
        pairs = zip(u.layout.slots, u.params, strict=True)
        grads = [(slot, p.grad.reshape(-1)) for slot, p in pairs if p.grad is not None]
        shard = u.layout.shard_numel

        def fill(rows: torch.Tensor, a: int, b: int) -> None:
            fill_rows(rows, grads, shard, a, b)

        self._reduce_scatter(u, fill, None, accumulate=True, async_op=async_op)
        for p in u.params:
            self.pool.streams.keep(p.grad)  # copied in on the side stream (CUDA): not reused before that
            p.grad = None  # the unsharded gradients are in the buckets now: free them

    def _reduce_arena(self, u: UnitState, arenas: GradArenas, async_op: bool) -> None:
        arenas.bind(u)  # a unit whose backward did not run sends zeros from a fresh arena
        assert u.arena is not None
        rows_of = u.arena.view(self.n, -1)

        def fill(rows: torch.Tensor, a: int, b: int) -> None:
            rows.copy_(rows_of[:, a:b])

        direct = u.arena if u.arena.dtype == self.dtypes.reduce else None
        copied = self._reduce_scatter(u, fill, direct, True, async_op, then=lambda: arenas.release(u))
        if copied is not None:
            # Every chunk is queued to be copied into a bucket: the arena may be lent again, but the next unit's
            # zeroing and accumulation into it must wait until the last copy has read it.
            arenas.release(u, after=copied)


class ParametersStrategy(GradientsStrategy):
    """Stage 3: only the shard is held; the full buffer is allocated while a unit is gathered."""

    stage = Stage.PARAMETERS
    keeps_full_params = False

    def after_step(self, u: UnitState, async_op: bool = False) -> None:
        assert u.shard is not None
        if self._mixed:
            u.shard.copy_(u.master)
        if u.resident and u.gathered:
            self._gather_again(u, u.shard, async_op)


def _chain(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()

    return both


STRATEGIES: dict[Stage, type[Strategy]] = {
    Stage.DATA_PARALLEL: Strategy,
    Stage.OPTIMIZER_STATES: OptimizerStatesStrategy,
    Stage.GRADIENTS: GradientsStrategy,
    Stage.PARAMETERS: ParametersStrategy,
}
