"""A `Unit` built for its stage: the range of the model's values a rank keeps, the unit's buffers, and a frozen
unit's (compute-dtype weights only) in place of a trainable one's."""

from __future__ import annotations

import torch
from torch import nn

from zerotrain.runtime.zero.flat_buffer import FlatBuffer
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.runtime.zero.unit import ParamState, Unit
from zerotrain.runtime.zero.unit_context import UnitContext


def kept_range(ctx: UnitContext, layout: UnitLayout) -> tuple[int, int]:
    """The unit-coordinate range whose fp32 master this rank keeps: its shard at stages 1-3, the unit at stage 0."""
    return layout.shard_range(ctx.comm.rank) if ctx.policy.optimizer else (0, layout.padded)


def build_unit(
    ctx: UnitContext, index: int, layout: UnitLayout, params: list[nn.Parameter], values: torch.Tensor, persist: int
) -> Unit:
    """Buffers of one unit, as the policy shards them, from `values`: the fp32 values of `kept_range` only, which
    become the master where it is a buffer of its own; stages 1/2 then gather their full compute parameters from
    the shards, as after a step. A stage-3 unit of at most `persist` elements stays gathered once gathered."""
    if layout.frozen:
        return _build_frozen(ctx, index, layout, params, values, persist)
    policy, compute, device = ctx.policy, ctx.dtypes.compute, values.device
    lo, hi = kept_range(ctx, layout)
    full = FlatBuffer(layout, compute, device)
    full.bind(params)
    shard = None
    pin = device.type == "cuda"  # pinned host buffers: the copies to and from the device do not block the host
    if policy.parameters:
        shard = held = values if compute == torch.float32 and not ctx.offload else values.to(compute, copy=True)
        if ctx.offload_parameters:
            shard = held = shard.to("cpu").pin_memory() if pin else shard.to("cpu")
        full.free()
    else:
        held = full.data[lo:hi]
        if not ctx.own_master:
            held.copy_(values)  # fp32 on the device: this slot of the full buffer is the master itself
    grad_full = None
    if not policy.gradients:
        grad_full = FlatBuffer(layout, compute, device)
        grad_full.bind_grads(params)
    if ctx.offload and shard is not None and ctx.offload_parameters and compute == torch.float32:
        master = shard  # the offloaded fp32 shard is the master the host step updates: one host copy, not two
    elif ctx.offload:
        master = values.to("cpu", copy=True)
        master = master.pin_memory() if pin else master
    else:
        master = values if ctx.mixed else held
    if grad_full is not None and not ctx.mixed:
        grad_shard = grad_full.data[lo:hi]
    else:
        grad_shard = torch.zeros(hi - lo, dtype=torch.float32, device=device)
    unit = Unit(index, layout, params, ctx, full, master, grad_shard, (lo, hi), shard, grad_full)
    unit.resident = not policy.parameters or layout.padded <= persist
    unit.params_state = ParamState.SHARDED if policy.parameters else ParamState.GATHERED
    if ctx.offload:
        unit.host_grad = torch.zeros(hi - lo, dtype=torch.float32, pin_memory=pin)
    if not policy.parameters:
        unit.after_step(async_op=False)  # the full compute parameters: copied from the master, gathered at 1/2
    return unit


def _build_frozen(
    ctx: UnitContext, index: int, layout: UnitLayout, params: list[nn.Parameter], values: torch.Tensor, persist: int
) -> Unit:
    """A unit of frozen parameters: their values in the compute dtype only, sharded as the stage shards parameters;
    no fp32 master, no gradient and no optimizer state. Its `master` is the compute-dtype range this rank keeps
    (the stage-3 shard, or its slot of the full buffer), what a checkpoint saves of it; stages 1/2 gather the full
    values from the slots once, here, and never again (nothing updates them)."""
    compute, device = ctx.dtypes.compute, values.device
    lo, hi = kept_range(ctx, layout)
    full = FlatBuffer(layout, compute, device)
    full.bind(params)
    shard = None
    if ctx.policy.parameters:
        shard = master = values.to(compute)
        if ctx.offload_parameters:
            shard = master = shard.to("cpu").pin_memory() if device.type == "cuda" else shard.to("cpu")
        full.free()
    else:
        master = full.data[lo:hi]
        master.copy_(values)
    no_grads = torch.zeros(0, dtype=torch.float32, device=device)
    unit = Unit(index, layout, params, ctx, full, master, no_grads, (lo, hi), shard, None)
    unit.resident = not ctx.policy.parameters or layout.padded <= persist
    unit.params_state = ParamState.SHARDED if ctx.policy.parameters else ParamState.GATHERED
    if ctx.policy.optimizer and not ctx.policy.parameters:
        unit.after_step(async_op=False)  # stages 1/2: the full values from every rank's slot
    return unit
