"""A unit's chunked collectives: how its gradients are reduced and its updated shards gathered through the pool.

Reduce-scatters, the stage 1/2 all-gathers of units larger than `allgatherBucketElements` and stage 0's
all-reduce under mixed precision run in chunks through `buckets` (at most `reduceBucketElements` /
`allgatherBucketElements` per chunk, two persistent fixed-size buffers per dtype, allocated once); stage 0's
all-reduce in the compute dtype works in place on the flat gradient buffer, and the other gathers go straight into
the unit's own parameter buffer (that memory is the gathered parameters, not a communication buffer).

Streams (`streams`): each chunk's copy into its bucket, the pre-divide and the collective's launch are one piece of
side-stream work; results are applied on the compute stream after it waited for that work, and memory the copy
reads (a gradient arena) is zeroed for the next unit only after the same wait.

The unit (`unit.Unit`) decides which of these its stage runs; these functions only move bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from zerotrain.plan.peak import ACROSS_GROUPS
from zerotrain.runtime.zero.buckets import Finish, Then, chunks

if TYPE_CHECKING:
    from zerotrain.runtime.zero.collectives import Pending
    from zerotrain.runtime.zero.grad_arena import GradArenas
    from zerotrain.runtime.zero.streams import SideWork
    from zerotrain.runtime.zero.unit import Unit


def all_reduce(u: Unit, src: torch.Tensor, async_op: bool) -> None:
    """Launch the unit's gradient all-reduce (stage 0, at the accumulation boundary): in place when the
    gradients already have the reduce dtype, else chunk by chunk through the pool's fixed buffers."""
    ctx = u.ctx
    if src.dtype == ctx.dtypes.reduce:

        def send() -> Pending:
            ctx.divide_before_reduce(src)
            return ctx.comm.all_reduce(src, u.name, async_op=True, mean=True)

        def finish_in_place() -> None:
            ctx.divide_after_reduce(src)
            if src.data_ptr() != u.grad_shard.data_ptr():
                u.fp32_grads().copy_(src)

        ctx.pool.launch(send, finish_in_place, None)
    else:
        for a in range(0, src.numel(), ctx.pool.capacity):
            b = min(a + ctx.pool.capacity, src.numel())
            buf = ctx.pool.acquire(b - a, ctx.dtypes.reduce, src.device)

            def send_chunk(buf: torch.Tensor = buf, a: int = a, b: int = b) -> Pending:
                buf.copy_(src[a:b])
                ctx.divide_before_reduce(buf)
                return ctx.comm.all_reduce(buf, u.name, async_op=True, mean=True)

            ctx.pool.launch(send_chunk, _apply_all_reduced(u, buf, a, b), buf)
    if not async_op:
        ctx.pool.drain()


def _apply_all_reduced(u: Unit, buf: torch.Tensor, a: int, b: int) -> Callable[[], None]:
    def finish() -> None:
        u.ctx.divide_after_reduce(buf)
        u.fp32_grads()[a:b].copy_(buf)

    return finish


def reduce_scatter(
    u: Unit,
    fill: Callable[[torch.Tensor, int, int], None],
    direct: torch.Tensor | None,
    accumulate: bool,
    async_op: bool,
    then: Callable[[], None] | None = None,
    boundary: bool = True,
) -> SideWork[Pending] | None:
    """Reduce-scatter the unit chunk by chunk; `fill(rows, a, b)` writes every rank's columns [a, b).

    Hybrid sharding, at the accumulation `boundary`: each chunk of the shard, summed over this step's
    micro-batches, is then averaged across the groups (`across_groups`).

    `direct`, a flat buffer already holding the whole unit in the reduce dtype, is sent as it is when one chunk
    covers the unit (no copy, no bucket); then it is read until the collective finishes, after which `then` runs,
    and None is returned. Otherwise the ticket of the last copy-in is returned: the gradients `fill` reads may be
    overwritten only after the compute stream waited for it.
    """
    ctx, n = u.ctx, u.ctx.n
    ranges = chunks(u.layout.shard_numel, n, ctx.reduce_bucket)
    device = u.grad_shard.device
    last: SideWork[Pending] | None = None
    for a, b in ranges:
        width = b - a
        whole = direct if len(ranges) == 1 else None
        if whole is not None:
            lent = ctx.pool.acquire(width, ctx.dtypes.reduce, device)
            bucket, out = whole, lent
        else:
            # One pooled buffer holds the chunk's bucket (N columns) and its output (one more).
            lent = ctx.pool.acquire((n + 1) * width, ctx.dtypes.reduce, device)
            bucket, out = lent[: n * width], lent[n * width :]

        def send(
            bucket: torch.Tensor = bucket, out: torch.Tensor = out, copy: bool = whole is None, a: int = a, b: int = b
        ) -> Pending:
            if copy:
                fill(bucket.view(n, b - a), a, b)
            ctx.divide_before_reduce(bucket)
            return ctx.comm.reduce_scatter(out, bucket, u.name, async_op=True, mean=True)

        crossing = ctx.across is not None and boundary
        apply = _apply_scattered(u, out, a, b, accumulate, last=boundary and not crossing)
        finish: Finish = across_groups(u, out, a, b, apply) if crossing else apply
        if whole is not None and then is not None:
            finish = _chain(finish, then)
        ticket = ctx.pool.launch(send, finish, lent)
        if whole is None:
            last = ticket
    if not async_op:
        ctx.pool.drain()
    return last


def reduce_scatter_full(u: Unit, src: torch.Tensor, async_op: bool, boundary: bool) -> None:
    """Stage 1 at the accumulation boundary: the flat full gradients (or their fp32 sum) reduce-scattered into the
    shard, straight from `src` when it has the reduce dtype."""
    rows_of = src.view(u.ctx.n, -1)

    def fill_full(rows: torch.Tensor, a: int, b: int) -> None:
        rows.copy_(rows_of[:, a:b])

    direct = src if src.dtype == u.ctx.dtypes.reduce else None
    reduce_scatter(u, fill_full, direct, accumulate=False, async_op=async_op, boundary=boundary)


def _apply_scattered(u: Unit, out: torch.Tensor, a: int, b: int, accumulate: bool, last: bool) -> Callable[[], None]:
    """Put the chunk's reduce-scatter into the fp32 shard; when it is the step's `last` write to those columns,
    an offloaded optimizer's copy of them starts now."""

    def finish() -> None:
        u.ctx.divide_after_reduce(out)
        if accumulate:
            u.grad_shard[a:b].add_(out)
        else:
            u.fp32_grads()[a:b].copy_(out)
        if last:
            u.stream_out(a, b)

    return finish


def across_groups(u: Unit, out: torch.Tensor, a: int, b: int, apply: Callable[[], None]) -> Finish:
    """After `apply` put the chunk's reduce-scatter into the fp32 shard, average shard columns [a, b) across the
    groups in the reduce dtype, through the same buffer, and write the mean back."""
    ctx, across = u.ctx, u.ctx.across
    assert across is not None

    def send() -> Pending:
        out.copy_(u.grad_shard[a:b])
        ctx.divide_before_reduce(out, across)
        return across.all_reduce(out, u.name, async_op=True, label=ACROSS_GROUPS, mean=True)

    def finish() -> None:
        ctx.divide_after_reduce(out, across)
        u.grad_shard[a:b].copy_(out)
        u.stream_out(a, b)

    def first() -> Then:
        apply()
        return Then(send, finish)

    return first


def reduce_arena(u: Unit, arenas: GradArenas, async_op: bool, boundary: bool = True) -> None:
    """Reduce-scatter the unit's contiguous gradients from its arena, then lend the arena again."""
    arenas.bind(u)  # a unit whose backward did not run sends zeros from a fresh arena
    assert u.arena is not None
    rows_of = u.arena.view(u.ctx.n, -1)

    def fill(rows: torch.Tensor, a: int, b: int) -> None:
        rows.copy_(rows_of[:, a:b])

    direct = u.arena if u.arena.dtype == u.ctx.dtypes.reduce else None
    copied = reduce_scatter(u, fill, direct, True, async_op, then=lambda: arenas.release(u), boundary=boundary)
    if copied is not None:
        # Every chunk is queued to be copied into a bucket: the arena may be lent again, but the next unit's
        # zeroing and accumulation into it must wait until the last copy has read it.
        arenas.release(u, after=copied)


def gather_in_chunks(u: Unit) -> None:
    """All-gather a large unit's updated shard through the pool's constant-size buffers (synchronously)."""
    ctx, n, shard = u.ctx, u.ctx.n, u.layout.shard_numel
    for a, b in chunks(shard, n, ctx.allgather_bucket):
        width = b - a
        lent = ctx.pool.acquire((n + 1) * width, ctx.dtypes.compute, u.full.data.device)  # not the host master
        recv, send = lent[: n * width], lent[n * width :]
        send.copy_(u.master[a:b])
        ctx.comm.all_gather(recv, send, u.name)
        u.full.data.view(n, shard)[:, a:b].copy_(recv.view(n, width))
        ctx.pool.give_back(lent)
    ctx.pool.drain()


def _chain(first: Finish, second: Callable[[], None]) -> Finish:
    def both() -> Then | None:
        then = first()
        second()
        return then

    return both
