"""A `Unit` built for its paths: the range of the model's values a rank keeps and the buffers its paths need (a
frozen unit's: its compute-dtype values only, no master, gradients or optimizer state)."""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.zero.flat_buffer import FlatBuffer
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.runtime.zero.unit import ParamState, Unit
from zerotrain.runtime.zero.unit_context import UnitContext
from zerotrain.runtime.zero.unit_paths import MasterPath, ReducePath, choose_paths


def kept_range(ctx: UnitContext, layout: UnitLayout) -> tuple[int, int]:
    """The unit-coordinate range whose fp32 master this rank keeps: its shard at stages 1-3, the unit at stage 0."""
    return layout.shard_range(ctx.comm.rank) if ctx.policy.optimizer else (0, layout.padded)


def build_unit(
    ctx: UnitContext, index: int, layout: UnitLayout, params: list[nn.Parameter], values: torch.Tensor, persist: int
) -> Unit:
    """Buffers of one unit, as its paths (`unit_paths`) need them, from `values`: the fp32 values of `kept_range`
    only, which become the master where it is a buffer of its own; stages 1/2 then gather their full compute
    parameters from the shards, as after a step. A stage-3 unit of at most `persist` elements stays gathered once
    gathered."""
    paths = choose_paths(ctx, layout)
    compute, device = ctx.dtypes.compute, values.device
    lo, hi = kept_range(ctx, layout)
    full = FlatBuffer(layout, compute, device)
    full.bind(params)
    shard = None
    if ctx.policy.parameters:
        shard = held = values if compute == torch.float32 and not ctx.offload else values.to(compute, copy=True)
        if ctx.offload_parameters:
            shard = held = shard.to("cpu").pin_memory() if device.type == "cuda" else shard.to("cpu")
        full.free()
    else:
        held = full.data[lo:hi]
        if not paths.master.copied:
            held.copy_(values)  # this slot of the full buffer is the master itself (or a frozen unit's values)
    master = _master(paths.master, values, held)
    grad_full = None
    if paths.reduce.full_buffer:
        grad_full = FlatBuffer(layout, compute, device)
        grad_full.bind_grads(params)
    if paths.reduce is ReducePath.NONE:
        grad_shard = torch.zeros(0, dtype=torch.float32, device=device)
    elif grad_full is not None and not ctx.mixed:
        grad_shard = grad_full.data[lo:hi]  # fp32 stages 0/1: the optimizer reads its slot of the full gradients
    else:
        grad_shard = torch.zeros(hi - lo, dtype=torch.float32, device=device)
    unit = Unit(index, layout, params, ctx, paths, full, master, grad_shard, (lo, hi), shard, grad_full)
    unit.resident = not ctx.policy.parameters or layout.padded <= persist
    unit.params_state = ParamState.SHARDED if ctx.policy.parameters else ParamState.GATHERED
    if ctx.offload and paths.reduce is not ReducePath.NONE:
        unit.host_grad = torch.zeros(hi - lo, dtype=torch.float32, pin_memory=device.type == "cuda")
    if not ctx.policy.parameters:
        unit.after_step(async_op=False)  # the full compute parameters: copied from the master, gathered at 1/2
    return unit


def _master(path: MasterPath, values: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """The fp32 master the path names (a frozen unit's stand-in: the compute-dtype values it keeps)."""
    if path is MasterPath.HOST_COPY:
        host = values.to("cpu", copy=True)
        return host.pin_memory() if values.device.type == "cuda" else host
    return values if path is MasterPath.DEVICE_COPY else held
