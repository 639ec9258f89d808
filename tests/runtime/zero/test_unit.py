"""A unit's lifecycle: only the transitions it has; stage 3 reads gathered-ness from the state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.param_source import ModelValues
from zerotrain.runtime.zero.partition import build_units
from zerotrain.runtime.zero.unit import GradState, LifecycleError, ParamState, Unit
from zerotrain.runtime.zero.unit_build import build_unit
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.zero_config import Stage


def unit(stage: Stage) -> Unit:
    comm = Comm(timeout_seconds=60)
    ctx = UnitContext(comm, Dtypes(torch.float32, torch.float32), ShardPolicy.of(stage), BucketPool(comm), 64, 64)
    model = nn.Linear(4, 4)
    (layout,) = build_units(model, [], [], world_size=1)
    values = torch.empty(layout.padded)
    ModelValues(model).fill(layout, 0, layout.padded, values, comm)
    return build_unit(ctx, 0, layout, list(model.parameters()), values, persist=0)


def test_the_stage_is_a_policy_the_unit_reads() -> None:
    assert ShardPolicy.of(Stage.DATA_PARALLEL) == ShardPolicy(optimizer=False, gradients=False, parameters=False)
    assert ShardPolicy.of(Stage.GRADIENTS) == ShardPolicy(optimizer=True, gradients=True, parameters=False)
    three = unit(Stage.PARAMETERS)
    assert three.params_state is ParamState.SHARDED and not three.resident and three.grad_full is None
    one = unit(Stage.OPTIMIZER_STATES)
    assert one.params_state is ParamState.GATHERED and one.resident and one.grad_full is not None


def test_parameters_go_round_sharded_gathering_gathered_and_nowhere_else() -> None:
    u = unit(Stage.PARAMETERS)
    with pytest.raises(LifecycleError, match="parameters cannot go from sharded to gathered"):
        u.move_params(ParamState.GATHERED)  # a gather must be issued first
    with pytest.raises(LifecycleError, match="parameters cannot go from sharded to stale"):
        u.move_params(ParamState.STALE)  # a step cannot make unheld parameters stale
    for to in (ParamState.GATHERING, ParamState.GATHERED, ParamState.STALE, ParamState.GATHERING):
        u.move_params(to)
    with pytest.raises(LifecycleError, match="parameters cannot go from gathering to sharded"):
        u.move_params(ParamState.SHARDED)  # an in-flight gather is finished before the buffer is freed


def test_gradients_cannot_be_ready_before_a_backward_starts() -> None:
    u = unit(Stage.DATA_PARALLEL)
    with pytest.raises(LifecycleError, match="gradients cannot go from idle to ready"):
        u.move_grads(GradState.READY)
    for to in (GradState.ACCUMULATING, GradState.READY, GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE):
        u.move_grads(to)
