"""Flat layout arithmetic and the construction-time checks on model and config (no processes)."""

from __future__ import annotations

import itertools

import pytest
from tiny_models import TinyLM
from torch import nn

from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.partition import ALIGN, FROZEN_SUFFIX, ROOT_UNIT, ParamClass, build_units

NO_DECAY = ["*.bias", "*norm*"]


def test_units_are_padded_to_a_multiple_of_the_world_size_and_shards_tile_them() -> None:
    units = build_units(TinyLM(), ["Block"], NO_DECAY, world_size=4)
    assert [u.name for u in units] == ["blocks.0", "blocks.1", "blocks.2", ROOT_UNIT]
    block = units[0]
    # 471 parameter elements; six parameters each starting at a multiple of 16 end at 522; 4 shards of 144.
    assert (block.numel, block.extent, block.padded, block.shard_numel) == (471, 522, 576, 144)
    assert [block.shard_range(r) for r in range(4)] == [(0, 144), (144, 288), (288, 432), (432, 576)]
    assert sum(u.numel for u in units) == sum(p.numel() for p in TinyLM().parameters())


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_parameter_and_every_shard_starts_aligned(world: int) -> None:
    model = nn.Sequential(nn.Embedding(50_257, 8), nn.Linear(8, 3), nn.LayerNorm(3))  # odd sizes throughout
    (unit,) = build_units(model, [], NO_DECAY, world_size=world)
    assert all(s.offset % ALIGN == 0 for s in unit.slots)
    assert all(unit.shard_range(r)[0] % ALIGN == 0 for r in range(world))
    ends = sorted((s.offset, s.offset + s.numel) for s in unit.slots)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(ends))  # no overlap
    assert unit.padded - unit.numel < ALIGN * (len(unit.slots) + world)


def test_parameters_are_ordered_decay_then_no_decay_and_frozen_ones_form_the_units_twin() -> None:
    model = TinyLM()
    model.blocks[0].up.weight.requires_grad_(False)
    block, twin = build_units(model, ["Block"], NO_DECAY, world_size=2)[:2]
    kinds = [s.kind for s in block.slots]
    assert kinds == sorted(kinds)
    assert {s.name: s.kind for s in block.slots}["blocks.0.norm.weight"] is ParamClass.NO_DECAY
    assert ParamClass.FROZEN not in kinds and not block.frozen
    assert (twin.name, twin.frozen, twin.module) == ("blocks.0" + FROZEN_SUFFIX, True, block.module)
    assert [(s.name, s.kind, s.offset) for s in twin.slots] == [("blocks.0.up.weight", ParamClass.FROZEN, 0)]
    offsets = [s.offset for s in block.slots]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_a_shard_meets_each_optimizer_class_at_most_once() -> None:
    block = build_units(TinyLM(), ["Block"], NO_DECAY, world_size=2)[0]
    decay = next(seg for seg in block.class_segments() if seg.kind is ParamClass.DECAY)
    decay_elems = decay.stop - decay.start  # the class's run, alignment gaps between its parameters included
    segs = [block.shard_segments(r, (ParamClass.DECAY, ParamClass.NO_DECAY)) for r in range(2)]
    for s in segs:
        assert len({seg.kind for seg in s}) == len(s)
    assert sum(seg.stop - seg.start for s in segs for seg in s if seg.kind is ParamClass.DECAY) == decay_elems


def test_tied_parameter_used_outside_its_unit_moves_to_the_root() -> None:
    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(3, 3)
            self.outer = nn.Linear(3, 3)
            self.outer.weight = self.inner.weight

    units = build_units(Wrap(), ["Linear"], [], world_size=1)
    by_name = {u.name: [s.name for s in u.slots] for u in units}
    assert by_name["inner"] == ["inner.bias"]
    assert "inner.weight" in by_name[ROOT_UNIT]


@pytest.mark.parametrize(
    ("model", "units", "world", "field"),
    [
        (nn.ReLU(), [], 1, "model"),
        (TinyLM(), ["Blok"], 1, "zero.unitModules[0]"),
        (nn.Linear(1, 1), [], 3, "WORLD_SIZE"),
    ],
)
def test_bad_models_are_refused_with_field_value_and_fix(
    model: nn.Module, units: list[str], world: int, field: str
) -> None:
    with pytest.raises(ZeroSetupError) as err:
        build_units(model, units, [], world_size=world)
    assert err.value.field == field
    assert isinstance(err.value, ValueError)
    assert "; " in str(err.value) and err.value.fix
