"""A unit's chunked collectives (`unit_comm`): every chunk of shard columns is filled once and its reduction lands
in the fp32 shard (added or copied); a unit sent directly is read in place; stage 0's all-reduce is in place in
the reduce dtype, else chunked; an arena is reduced and lent again; a large unit's gather is assembled chunk by
chunk. On 2 gloo ranks the results are the mean (the gather: the concatenation) a plain torch computation gives."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from dist_helpers import run_ranks
from torch import nn

from zerotrain.runtime.zero import unit_comm
from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.param_source import ModelValues
from zerotrain.runtime.zero.partition import build_units
from zerotrain.runtime.zero.process_group import hybrid_groups
from zerotrain.runtime.zero.unit import Unit
from zerotrain.runtime.zero.unit_build import build_unit, kept_range
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.zero_config import Stage

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
Calls = list[tuple[int, int, int]]
"""(rows, a, b) of each `fill`: one row per rank, shard columns [a, b)."""


def unit(
    stage: Stage, compute: torch.dtype = F32, reduce: torch.dtype = F32, bucket: int = 32, hybrid: bool = False
) -> Unit:
    """One unit of a Linear(8, 8) (72 elements: 80 padded on one rank, 96 on two) sharded over every rank, or
    (`hybrid`) over this rank alone, averaged across the others at the accumulation boundary."""
    groups = hybrid_groups(1) if hybrid else (None, None)
    comm = Comm(60, groups[0])
    ctx = UnitContext(comm, Dtypes(compute, reduce), ShardPolicy.of(stage), BucketPool(comm), bucket, bucket)
    ctx.across = Comm(60, groups[1]) if hybrid else None
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    (layout,) = build_units(model, [], [], comm.world_size)
    ctx.size_pool([layout])
    lo, hi = kept_range(ctx, layout)
    values = torch.empty(hi - lo)
    ModelValues(model).fill(layout, lo, hi, values, comm)
    return build_unit(ctx, 0, layout, list(model.parameters()), values, persist=0)


def rank_grads(u: Unit, rank: int) -> torch.Tensor:
    """This rank's full gradients: exact in every dtype used here, and different on every rank."""
    return torch.arange(u.layout.padded, dtype=F32) * (rank + 1)


def filler(full: torch.Tensor, calls: Calls) -> Callable[[torch.Tensor, int, int], None]:
    def fill(rows: torch.Tensor, a: int, b: int) -> None:
        calls.append((rows.shape[0], a, b))
        rows.copy_(full.view(rows.shape[0], -1)[:, a:b])

    return fill


def test_reduce_scatter_fills_each_chunk_once_and_adds_or_copies_into_the_shard() -> None:
    u = unit(Stage.GRADIENTS)
    grads, calls = rank_grads(u, 0), Calls()
    # One rank: chunks of 32 columns over the 80-element shard, the last one short.
    ticket = unit_comm.reduce_scatter(u, filler(grads, calls), None, accumulate=True, async_op=False)
    assert calls == [(1, 0, 32), (1, 32, 64), (1, 64, 80)]
    assert ticket is not None and ticket.ran and torch.equal(u.grad_shard, grads)
    unit_comm.reduce_scatter(u, filler(grads, calls), None, accumulate=True, async_op=True)
    assert u.ctx.pool.inflight  # the last chunks are still lent until drained
    u.ctx.pool.drain()
    assert torch.equal(u.grad_shard, 2 * grads)
    unit_comm.reduce_scatter(u, filler(grads, calls), None, accumulate=False, async_op=False)
    assert torch.equal(u.grad_shard, grads)


def test_a_unit_in_one_chunk_is_sent_as_it_is_and_then_runs_after_its_result_landed() -> None:
    u = unit(Stage.GRADIENTS, bucket=128)
    grads, calls, seen = rank_grads(u, 0), Calls(), list[torch.Tensor]()

    def then() -> None:
        seen.append(u.grad_shard.clone())

    ticket = unit_comm.reduce_scatter(u, filler(grads, calls), grads, True, async_op=False, then=then)
    assert ticket is None and calls == []  # no copy into a bucket
    assert len(seen) == 1 and torch.equal(seen[0], grads)


def test_stage0_all_reduce_is_in_place_in_the_reduce_dtype_and_chunked_through_the_pool_otherwise() -> None:
    same = unit(Stage.DATA_PARALLEL)
    assert same.grad_full is not None
    same.grad_full.data.copy_(rank_grads(same, 0))
    unit_comm.all_reduce(same, same.grad_full.data, async_op=False)
    assert torch.equal(same.grad_shard, rank_grads(same, 0)) and same.ctx.comm.stats.buffer_allocations == 0
    mixed = unit(Stage.DATA_PARALLEL, compute=BF16)
    assert mixed.grad_full is not None
    mixed.grad_full.data.copy_(rank_grads(mixed, 0))
    unit_comm.all_reduce(mixed, mixed.grad_full.data, async_op=False)
    assert torch.equal(mixed.fp32_grads(), rank_grads(mixed, 0)) and mixed.ctx.comm.stats.buffer_allocations > 0


@pytest.mark.parametrize("compute", [F32, BF16])
def test_an_arena_is_reduced_into_the_shard_and_lent_again(compute: torch.dtype) -> None:
    u = unit(Stage.GRADIENTS, compute=compute, bucket=128)
    arenas = GradArenas([u.layout], compute, torch.device("cpu"), u.ctx.pool, limit=128)
    arenas.bind(u)
    arena = u.arena
    assert arena is not None
    arena.copy_(rank_grads(u, 0))
    unit_comm.reduce_arena(u, arenas, async_op=False)
    assert torch.equal(u.grad_shard, rank_grads(u, 0))
    assert u.arena is None and all(p.grad is None for p in u.params)
    arenas.bind(u)  # given back: the same memory, zeroed
    assert u.arena is not None and u.arena.data_ptr() == arena.data_ptr() and torch.count_nonzero(u.arena) == 0


def test_a_large_unit_s_gather_is_assembled_chunk_by_chunk_in_the_compute_dtype() -> None:
    u = unit(Stage.GRADIENTS, compute=BF16)
    u.master.copy_(torch.arange(u.master.numel(), dtype=F32) - 40)
    unit_comm.gather_in_chunks(u)
    assert u.full.data.dtype == BF16 and torch.equal(u.full.data.float(), u.master)
    assert not u.ctx.pool.inflight


def on_two_ranks(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Each collective of the module on this rank's data; the parent checks them against plain torch."""
    from zerotrain.runtime.zero.process_group import init_from_env

    init_from_env(60, torch.device("cpu"))
    got: dict[str, torch.Tensor] = {}
    for name, reduce in (("reduce_scatter", F32), ("reduce_scatter_fp16", F16)):
        u = unit(Stage.GRADIENTS, compute=reduce, reduce=reduce)  # 48 columns per rank: 3 chunks of 16
        calls = Calls()
        unit_comm.reduce_scatter(u, filler(rank_grads(u, rank), calls), None, accumulate=True, async_op=False)
        assert calls == [(2, 0, 16), (2, 16, 32), (2, 32, 48)], calls
        got[name] = u.grad_shard.clone()
    for name, compute in (("all_reduce_in_place", F32), ("all_reduce_chunked", BF16)):
        u = unit(Stage.DATA_PARALLEL, compute=compute)
        assert u.grad_full is not None
        u.grad_full.data.copy_(rank_grads(u, rank))
        unit_comm.all_reduce(u, u.grad_full.data, async_op=True)
        u.ctx.pool.drain()
        got[name] = u.fp32_grads().clone()
    u = unit(Stage.GRADIENTS, compute=BF16)
    u.master.copy_(torch.arange(48.0) + 100 * rank)
    unit_comm.gather_in_chunks(u)
    got["gather"] = u.full.data.float()
    for boundary in (False, True):  # shard groups of one rank each: only the boundary averages across them
        u = unit(Stage.GRADIENTS, hybrid=True)
        unit_comm.reduce_scatter(u, filler(rank_grads(u, rank), Calls()), None, True, async_op=False, boundary=boundary)
        got[f"across_groups_{boundary}"] = u.grad_shard.clone()
    return got


@pytest.mark.slow
def test_on_two_ranks_reductions_give_the_mean_and_the_gather_every_rank_s_shard() -> None:
    full = torch.arange(96.0) * 1.5  # the mean of rank_grads over ranks 0 and 1
    for rank, got in enumerate(run_ranks(on_two_ranks, 2, timeout=60)):
        assert torch.equal(got["reduce_scatter"], full.view(2, 48)[rank])
        assert torch.equal(got["reduce_scatter_fp16"], full.view(2, 48)[rank])  # fp16: divided by N before the sum
        assert torch.equal(got["all_reduce_in_place"], full)
        assert torch.equal(got["all_reduce_chunked"], full)
        assert torch.equal(got["gather"], torch.cat([torch.arange(48.0), torch.arange(48.0) + 100]))
        assert torch.equal(got["across_groups_False"], torch.arange(80.0) * (rank + 1))
        assert torch.equal(got["across_groups_True"], torch.arange(80.0) * 1.5)
