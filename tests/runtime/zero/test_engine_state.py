"""The engine's state as one value: `state_dict()` is every rank's shards, counters, loss scaler and buffers with a
layout record; `load_state_dict()` of it continues training exactly as the engine it came from would, and refuses a
state laid out otherwise with the engine unchanged. Checkpoints save and load through these two alone."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from torch import nn

D = 6


class Normed(nn.Module):
    """A unit with a BatchNorm: its running statistics are buffers the state must carry."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.bn = nn.BatchNorm1d(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.bn(self.fc(x)))


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Normed(), Normed(), nn.Linear(D, 1))


def _engine(seed: int, stage: int, units: list[str]) -> Any:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=units, broadcast_buffers=False)
    return ZeroEngine(_model(seed), cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=0.05, weight_decay=0.1))


def _step(engine: Any, rank: int, step: int) -> float:
    x = torch.randn(4, D, generator=torch.Generator().manual_seed(10 * step + rank))
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    return float(loss)


def _copy(state: Any) -> Any:
    """A state that outlives the engine's next step (its tensors are the engine's own)."""
    return dataclasses.replace(
        state,
        masters=[m.clone() for m in state.masters],
        optimizer=copy.deepcopy(state.optimizer),
        buffers={n: t.clone() for n, t in state.buffers.items()},
    )


def continued(rank: int, world: int, stage: int) -> dict[str, Any]:
    first = _engine(0, stage, ["Normed"])
    for step in range(3):
        _step(first, rank, step)
    saved = _copy(first.state_dict())
    want_loss = _step(first, rank, 3)
    second = _engine(7, stage, ["Normed"])  # other starting weights: everything must come from the state
    _step(second, rank, 99)  # its own state, and (stages 1, 2) the gather a step leaves in flight
    second.load_state_dict(saved)
    got_loss = _step(second, rank, 3)
    a, b = first.state_dict(), second.state_dict()
    return {
        "losses": (want_loss, got_loss),
        "weights": (first.full_state_dict(), second.full_state_dict()),
        "positions": (a.position, b.position),
        "buffers": (a.buffers, b.buffers),
        "same_layout": a.layout == b.layout,
        "layout": a.layout,
    }


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_loaded_state_continues_exactly_as_the_engine_it_came_from(stage: int) -> None:
    for got in run_ranks(continued, 2, stage):
        assert got["losses"][0] == got["losses"][1]
        want, mine = got["weights"]
        assert want.keys() == mine.keys()
        for name in want:
            torch.testing.assert_close(mine[name], want[name], rtol=0, atol=0, msg=name)
        assert got["positions"][0] == got["positions"][1]
        assert got["positions"][0].steps == 4
        # Each rank keeps its own statistics (broadcastBuffers off), and they came through the state.
        assert {"0.bn.running_mean", "1.bn.running_var", "1.bn.num_batches_tracked"} <= set(got["buffers"][0])
        for name, value in got["buffers"][0].items():
            torch.testing.assert_close(got["buffers"][1][name], value, rtol=0, atol=0, msg=name)
        assert got["same_layout"]


def test_the_layout_shards_every_unit_once_over_the_ranks() -> None:
    layouts = [got["layout"] for got in run_ranks(continued, 2, 3)]
    assert [la.rank for la in layouts] == [0, 1]
    assert all(la.world_size == 2 and la.shard_group_size == 2 and la.holds_model_states for la in layouts)
    units = layouts[0].units
    assert [[s.name for s in u.params] for u in units] == [
        ["0.fc.weight", "0.fc.bias", "0.bn.weight", "0.bn.bias"],
        ["1.fc.weight", "1.fc.bias", "1.bn.weight", "1.bn.bias"],
        ["2.weight", "2.bias"],
    ]
    for index, unit in enumerate(units):
        assert unit.numel == sum(s.numel for s in unit.params) and unit.extent >= unit.numel
        ranges = sorted(la.units[index].master_range for la in layouts)
        assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0], ranges  # adjacent: no gap, no overlap
        assert ranges[1][1] >= unit.extent, ranges  # together they hold every element
    # Only rank 0 saves the buffers when they are broadcast; each rank its own when not (as here).
    assert all(la.saves_buffers for la in layouts)


def refused(rank: int, world: int) -> dict[str, Any]:
    from zerotrain.runtime.zero.engine_errors import ZeroSetupError

    per_unit = _engine(0, 3, ["Normed"])
    whole = _engine(1, 3, [])  # one unit: the same parameters sharded otherwise
    before = whole.full_state_dict()
    own = whole.state_dict()
    odd = dataclasses.replace(own, buffers={**(own.buffers or {}), "0.bn.running_men": torch.zeros(D)})
    errors = []
    for state in (per_unit.state_dict(), odd):
        try:
            whole.load_state_dict(state)
        except ZeroSetupError as e:
            errors.append(str(e))
    after = whole.full_state_dict()
    return {"errors": errors, "unchanged": all(torch.equal(before[n], after[n]) for n in before)}


def test_a_state_laid_out_otherwise_is_refused_with_the_engine_unchanged() -> None:
    for got in run_ranks(refused, 2):
        shards, buffer = got["errors"]
        assert shards.startswith("state: got 'rank ") and "checkpoint.load()" in shards, shards
        assert "buffer '0.bn.running_men' is not one of this model's" in buffer, buffer
        assert got["unchanged"]
