"""Each unit chooses its master, reduce and refresh paths once, from the engine's settings and its layout; the
buffers build_unit makes are the ones those paths need."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.param_source import ModelValues
from zerotrain.runtime.zero.partition import UnitLayout, build_units
from zerotrain.runtime.zero.unit import LifecycleError
from zerotrain.runtime.zero.unit_build import build_unit
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.runtime.zero.unit_paths import MasterPath, ReducePath, RefreshPath, UnitPaths, choose_paths
from zerotrain.zero_config import Stage

M, R, F = MasterPath, ReducePath, RefreshPath


def context(
    stage: Stage,
    compute: torch.dtype = torch.float32,
    offload: bool = False,
    offload_parameters: bool = False,
    arena_limit: int | None = None,
    allgather_bucket: int = 1 << 20,
) -> UnitContext:
    comm = Comm(timeout_seconds=60)
    pool = BucketPool(comm)
    ctx = UnitContext(
        comm,
        Dtypes(compute, compute),
        ShardPolicy.of(stage),
        pool,
        1 << 20,
        allgather_bucket,
        offload=offload,
        offload_parameters=offload_parameters,
    )
    if arena_limit is not None:
        ctx.arenas = GradArenas([], compute, torch.device("cpu"), pool, arena_limit)
    return ctx


def layout(frozen: bool = False) -> tuple[nn.Module, UnitLayout]:
    model = nn.Linear(4, 4)
    model.requires_grad_(not frozen)
    (la,) = [la for la in build_units(model, [], [], world_size=1) if la.frozen is frozen]
    return model, la


S0, S1, S2, S3 = Stage.DATA_PARALLEL, Stage.OPTIMIZER_STATES, Stage.GRADIENTS, Stage.PARAMETERS
BF16 = torch.bfloat16

CASES = {  # (context settings, frozen) -> the paths
    "stage 0 fp32": ((S0,), False, UnitPaths(M.SLOT, R.ALL_REDUCE_FULL, F.NONE)),
    "stage 0 bf16": ((S0, BF16), False, UnitPaths(M.DEVICE_COPY, R.ALL_REDUCE_FULL, F.COPY)),
    "stage 0 offload": ((S0, torch.float32, True), False, UnitPaths(M.HOST_COPY, R.ALL_REDUCE_FULL, F.COPY)),
    "stage 1 fp32": ((S1,), False, UnitPaths(M.SLOT, R.SCATTER_FULL, F.GATHER_SLOT)),
    "stage 1 bf16": ((S1, BF16), False, UnitPaths(M.DEVICE_COPY, R.SCATTER_FULL, F.GATHER_SLOT)),
    "stage 2 fp32": ((S2,), False, UnitPaths(M.SLOT, R.SCATTER_GRADS, F.GATHER_SLOT)),
    "stage 2 arena": (
        (S2, torch.float32, False, False, 1 << 10),
        False,
        UnitPaths(M.SLOT, R.SCATTER_ARENA, F.GATHER_SLOT),
    ),
    "stage 2 unit over the arena limit": (
        (S2, torch.float32, False, False, 8),
        False,
        UnitPaths(M.SLOT, R.SCATTER_GRADS, F.GATHER_SLOT),
    ),
    "stage 2 gathered in chunks": (
        (S2, torch.float32, False, False, None, 8),
        False,
        UnitPaths(M.SLOT, R.SCATTER_GRADS, F.GATHER_CHUNKS),
    ),
    "stage 3 fp32": ((S3,), False, UnitPaths(M.SHARD, R.SCATTER_GRADS, F.SHARD)),
    "stage 3 bf16": ((S3, BF16), False, UnitPaths(M.DEVICE_COPY, R.SCATTER_GRADS, F.SHARD)),
    "stage 3 optimizer offload": ((S3, torch.float32, True), False, UnitPaths(M.HOST_COPY, R.SCATTER_GRADS, F.SHARD)),
    # The offloaded fp32 shard is the host master: one host copy, not two.
    "stage 3 full offload fp32": ((S3, torch.float32, True, True), False, UnitPaths(M.SHARD, R.SCATTER_GRADS, F.SHARD)),
    "stage 3 full offload bf16": ((S3, BF16, True, True), False, UnitPaths(M.HOST_COPY, R.SCATTER_GRADS, F.SHARD)),
    "frozen, stage 0": ((S0, BF16), True, UnitPaths(M.FROZEN, R.NONE, F.NONE)),
    "frozen, stage 2": ((S2, BF16, False, False, 1 << 10), True, UnitPaths(M.FROZEN, R.NONE, F.GATHER_SLOT)),
    "frozen, stage 3": ((S3, BF16, True, True), True, UnitPaths(M.FROZEN, R.NONE, F.SHARD)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_unit_chooses_one_path_of_each_kind_from_its_settings(case: str) -> None:
    settings, frozen, want = CASES[case]
    assert choose_paths(context(*settings), layout(frozen)[1]) == want


@pytest.mark.parametrize("case", list(CASES))
def test_the_unit_holds_the_buffers_its_paths_need_and_no_others(case: str) -> None:
    settings, frozen, want = CASES[case]
    ctx = context(*settings)
    model, la = layout(frozen)
    ctx.size_pool([la])
    values = torch.empty(la.padded)
    ModelValues(model).fill(la, 0, la.padded, values, ctx.comm)
    u = build_unit(ctx, 0, la, [dict(model.named_parameters())[s.name] for s in la.slots], values, persist=0)
    assert u.paths == want
    assert (u.grad_full is not None) is want.reduce.full_buffer
    assert (u.shard is not None) is (want.refresh is F.SHARD)
    assert (u.host_grad is not None) is (want.master is M.HOST_COPY or (ctx.offload and want.master is M.SHARD))
    if want.master is M.SLOT:
        assert u.master.data_ptr() == u.full.data.data_ptr()  # the parameters are their own master
    if want.master is M.SHARD:
        assert u.master is u.shard
    if want.master.copied:
        assert u.master.dtype == torch.float32 and u.master.device.type == "cpu"
        assert u.master.data_ptr() not in {t.data_ptr() for t in (u.full.data, u.shard) if t is not None}
    if want.reduce is R.NONE:
        assert u.grad_shard.numel() == 0 and u.master_tensors() == []
        with pytest.raises(LifecycleError, match="frozen: it has no gradients to reduce"):
            u.reduce(async_op=False)
    # The values survive whichever way they are held (one rank: the master's range is the whole unit).
    torch.testing.assert_close(u.master.float()[: la.numel], values[: la.numel], atol=1e-2, rtol=1e-2)
