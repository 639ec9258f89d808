"""Contiguous gradients' arenas (`grad_arena.GradArenas`): sized by the largest served block unit, the root apart;
`bind` points a unit's `.grad` at a zeroed arena slice that autograd accumulates into; `release` unbinds and lends
the arena again, oldest given back first, zeroed only after the side work still reading it has run."""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.param_source import ModelValues
from zerotrain.runtime.zero.partition import build_units
from zerotrain.runtime.zero.streams import LazyStreams
from zerotrain.runtime.zero.unit import Unit
from zerotrain.runtime.zero.unit_build import build_unit, kept_range
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.zero_config import Stage

CPU = torch.device("cpu")


class Block(nn.Module):
    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)  # d·d weight, then its bias at the next multiple of 16 (partition.ALIGN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def stage2_units(model: nn.Module) -> tuple[UnitContext, list[Unit]]:
    """World-size-1 stage-2 units (no process group: `Comm` copies instead of launching collectives)."""
    comm = Comm(timeout_seconds=60)
    ctx = UnitContext(
        comm, Dtypes(torch.float32, torch.float32), ShardPolicy.of(Stage.GRADIENTS), BucketPool(comm), 64, 64
    )
    layouts = build_units(model, ["Block"], [], world_size=1)
    ctx.size_pool(layouts)
    named, units = dict(model.named_parameters()), []
    for i, la in enumerate(layouts):
        lo, hi = kept_range(ctx, la)
        values = torch.empty(hi - lo)
        ModelValues(model).fill(la, lo, hi, values, comm)
        units.append(build_unit(ctx, i, la, [named[s.name] for s in la.slots], values, persist=0))
    return ctx, units


def arenas_for(ctx: UnitContext, units: list[Unit], limit: int = 100) -> GradArenas:
    return GradArenas([u.layout for u in units], torch.float32, CPU, ctx.pool, limit)


def base_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_arenas_are_sized_by_the_largest_served_block_and_the_root_gets_its_own() -> None:
    half_frozen = Block(8)
    half_frozen.lin.bias.requires_grad_(False)  # a unit of its own, "1/frozen", with no gradients
    model = nn.Sequential(Block(4), half_frozen, Block(16), nn.Linear(3, 2))
    ctx, units = stage2_units(model)
    # Padded sizes: Block(4) 32, Block(8)'s weight 64 and its bias 16, Block(16) 272 (over the limit), the root 32.
    assert [u.layout.padded for u in units] == [32, 64, 16, 272, 32] and units[2].layout.frozen
    trainable = [u for u in units if not u.layout.frozen]  # what the engine passes
    arenas = arenas_for(ctx, trainable, limit=100)
    assert arenas.block_elements == 64
    assert arenas.nbytes == (2 * 64 + 32) * 4  # two block arenas (depth 2) and the root's
    assert [arenas.serves(u.layout) for u in units] == [True, True, False, False, True]
    big = units[3]
    arenas.bind(big)  # a unit over the limit keeps autograd's gradients
    assert big.arena is None and all(p.grad is None for p in big.params)
    none = arenas_for(ctx, trainable, limit=16)
    assert none.block_elements == 0 and none.nbytes == 0


def test_bind_points_grads_at_a_zeroed_arena_that_backward_accumulates_into() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(4, 2))
    reference = nn.Sequential(Block(), Block(), nn.Linear(4, 2))
    reference.load_state_dict(model.state_dict())
    ctx, units = stage2_units(model)
    arenas = arenas_for(ctx, units)
    for u in units:
        arenas.bind(u)
    x = torch.randn(3, 4)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    expected = {n: q.grad for n, q in reference.named_parameters() if q.grad is not None}
    for u in units:
        assert u.arena is not None and u.arena.numel() == u.layout.padded
        for slot, p in zip(u.layout.slots, u.params, strict=True):
            assert p.grad is not None and base_of(p.grad) == base_of(u.arena)
            assert torch.allclose(u.arena[slot.offset : slot.offset + slot.numel], expected[slot.name].flatten())
        assert torch.count_nonzero(u.arena[u.layout.extent :]) == 0  # padding gets no gradient
    first = units[0]
    storage = base_of(first.params[0].grad)
    arenas.release(first)
    assert first.arena is None and all(p.grad is None for p in first.params)
    arenas.bind(first)  # the same arena comes back, zeroed for the next backward
    assert first.arena is not None and base_of(first.arena) == storage and torch.count_nonzero(first.arena) == 0


def test_the_arena_given_back_longest_ago_is_lent_first_and_the_root_keeps_its_own() -> None:
    ctx, units = stage2_units(nn.Sequential(Block(), Block(), Block(), nn.Linear(4, 2)))
    arenas = arenas_for(ctx, units)
    a, b, c, root = units
    arenas.bind(a)
    arenas.bind(b)
    assert a.arena is not None and b.arena is not None
    at_a, at_b = base_of(a.arena), base_of(b.arena)
    arenas.release(b)
    arenas.release(a)
    arenas.bind(c)
    assert c.arena is not None and base_of(c.arena) == at_b  # b went back first
    arenas.bind(root)
    assert root.arena is not None and base_of(root.arena) not in (at_a, at_b)
    at_root = base_of(root.arena)
    arenas.release(root)
    arenas.bind(a)
    arenas.bind(b)  # both block arenas are held: a new one, never the root's
    assert a.arena is not None and base_of(a.arena) == at_a
    assert b.arena is not None and base_of(b.arena) not in (at_a, at_b, at_root)
    arenas.bind(root)
    assert root.arena is not None and base_of(root.arena) == at_root


def test_a_third_arena_is_made_only_when_no_reduction_in_flight_can_give_one_back() -> None:
    ctx, units = stage2_units(nn.Sequential(Block(), Block(), Block(), Block(), nn.Linear(4, 2)))
    arenas = arenas_for(ctx, units)
    a, b, c, d, _ = units
    two = arenas.nbytes
    arenas.bind(a)
    arenas.bind(b)
    assert a.arena is not None
    at_a = base_of(a.arena)
    # A reduction still reading a's arena: bind finishes it (which gives the arena back) instead of allocating.
    ctx.pool.launch(lambda: ctx.comm.all_reduce(torch.zeros(1), a.name, async_op=True), lambda: arenas.release(a), None)
    arenas.bind(c)
    assert not ctx.pool.inflight and c.arena is not None and base_of(c.arena) == at_a
    assert arenas.nbytes == two
    arenas.bind(d)  # both held, nothing in flight: a third one
    assert arenas.nbytes == two + arenas.block_elements * 4


def test_an_arena_still_read_by_queued_side_work_is_zeroed_only_after_it_ran() -> None:
    ctx, units = stage2_units(nn.Sequential(Block(), Block(), Block(), nn.Linear(4, 2)))
    ctx.pool.streams = LazyStreams()  # side work runs only when waited for, as late as a CUDA side stream may
    arenas = arenas_for(ctx, units)
    a, b, c, _ = units
    arenas.bind(a)
    arenas.bind(b)
    arena = a.arena
    assert arena is not None
    arena.fill_(3.0)
    copied: list[torch.Tensor] = []
    ticket = ctx.pool.streams.side(lambda: copied.append(arena.clone()))
    arenas.release(a, after=ticket)
    arenas.release(b)
    assert not ticket.ran
    arenas.bind(c)  # gets a's arena (given back first): the queued copy must read 3s, not the zeroing
    assert ticket.ran and torch.equal(copied[0], torch.full_like(arena, 3.0))
    assert c.arena is not None and base_of(c.arena) == base_of(arena) and torch.count_nonzero(c.arena) == 0
