"""A unit's flat buffer: parameters become views into it, freeing and allocating its storage keeps those views
(and what autograd saved) valid, and `fill_rows` lays gradients out by rank shard."""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.zero.flat_buffer import FlatBuffer, fill_rows
from zerotrain.runtime.zero.partition import ParamClass, ParamSlot, UnitLayout

CPU = torch.device("cpu")


def layout(world: int = 2) -> UnitLayout:
    slots = [
        ParamSlot("w", (2, 3), 0, 6, ParamClass.DECAY),
        ParamSlot("b", (3,), 8, 3, ParamClass.NO_DECAY),
    ]
    return UnitLayout("unit", slots, world)


def test_parameters_become_views_that_survive_a_free_and_an_allocate() -> None:
    params = [nn.Parameter(torch.randn(2, 3)), nn.Parameter(torch.randn(3))]
    buf = FlatBuffer(layout(), torch.float32, CPU)
    assert buf.data.numel() == buf.layout.padded and buf.layout.padded % 2 == 0
    buf.bind(params)
    buf.data.copy_(torch.arange(buf.layout.padded, dtype=torch.float32))
    assert torch.equal(params[0].detach().flatten(), torch.arange(6.0))
    assert torch.equal(params[1].detach(), torch.tensor([8.0, 9.0, 10.0]))
    nbytes = buf.nbytes()
    buf.free()
    assert not buf.allocated and buf.nbytes() == 0
    buf.allocate()
    assert buf.allocated and buf.nbytes() == nbytes
    buf.data.fill_(2.0)  # written into the buffer, seen through the same parameter objects
    assert torch.equal(params[1].detach(), torch.full((3,), 2.0))


def test_gradients_accumulate_into_the_buffer_and_shards_split_it_evenly() -> None:
    params = [nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(3))]
    grads = FlatBuffer(layout(), torch.float32, CPU)
    grads.bind_grads(params)
    (params[0].sum() * 2 + params[1].sum()).backward()
    assert torch.equal(grads.data[:6], torch.full((6,), 2.0)) and torch.equal(grads.data[8:11], torch.ones(3))
    halves = [grads.shard(r) for r in range(2)]
    assert [h.numel() for h in halves] == [grads.layout.shard_numel] * 2
    assert torch.equal(torch.cat(halves), grads.data)


def test_fill_rows_lays_each_rank_s_columns_with_zeros_where_no_gradient_lies() -> None:
    la = layout()
    w, b = torch.full((6,), 1.0), torch.full((3,), 5.0)
    shard = la.shard_numel
    rows = torch.full((2, shard), -1.0)
    fill_rows(rows, [(la.slots[0], w), (la.slots[1], b)], shard, 0, shard)
    whole = torch.zeros(la.padded)
    whole[0:6], whole[8:11] = w, b  # the gap (6, 7) and the padding stay zero
    assert torch.equal(rows.flatten(), whole)
    part = torch.full((2, 2), -1.0)
    fill_rows(part, [(la.slots[0], w)], shard, 4, 6)  # columns 4-5 of each shard, the weight's gradient only
    weight_only = torch.zeros(la.padded)
    weight_only[0:6] = w
    assert torch.equal(part, torch.stack([weight_only[r * shard + 4 : r * shard + 6] for r in range(2)]))
