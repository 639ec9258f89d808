"""A unit's lifecycle: only the transitions it has; stage 3 reads gathered-ness from the state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerotrain.runtime.flat_buffer import FlatBuffer
from zerotrain.runtime.partition import build_units
from zerotrain.runtime.unit import GradState, LifecycleError, ParamState, UnitState


def unit(state: ParamState) -> UnitState:
    (layout,) = build_units(nn.Linear(4, 4), [], [], world_size=2)
    full = FlatBuffer(layout, torch.float32, torch.device("cpu"))
    return UnitState(0, layout, [], full, torch.zeros(10), torch.zeros(10), params_state=state)


def test_parameters_go_round_sharded_gathering_gathered_and_nowhere_else() -> None:
    u = unit(ParamState.SHARDED)
    with pytest.raises(LifecycleError, match="parameters cannot go from sharded to gathered"):
        u.move_params(ParamState.GATHERED)  # a gather must be issued first
    for to in (ParamState.GATHERING, ParamState.GATHERED, ParamState.SHARDED):
        u.move_params(to)
    assert u.params_state is ParamState.SHARDED and not u.gathered


def test_gradients_cannot_be_ready_before_a_backward_starts() -> None:
    u = unit(ParamState.GATHERED)
    with pytest.raises(LifecycleError, match="gradients cannot go from idle to ready"):
        u.move_grads(GradState.READY)
    for to in (GradState.ACCUMULATING, GradState.READY, GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE):
        u.move_grads(to)
