"""What `ZeroEngine.__init__` builds, one function each: the process groups, the units' shared context, the units
with their starting values, the optimizer over the shards, and the modules' compile and recompute wrappers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from zerotrain.runtime.zero import optimizer as opt_mod
from zerotrain.runtime.zero.activations import apply_checkpointing
from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.buffers import move_buffers
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.compiled import compile_units
from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.param_source import ParameterSource
from zerotrain.runtime.zero.partition import UnitLayout, build_units
from zerotrain.runtime.zero.process_group import check_backend_serves, control_device, hybrid_groups, init_from_env
from zerotrain.runtime.zero.setup_checks import check_buckets, model_device, sharded_over, world_size_before_init
from zerotrain.runtime.zero.streams import streams_for
from zerotrain.runtime.zero.unit import Unit
from zerotrain.runtime.zero.unit_build import build_unit, kept_range
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.zero_config import ZeroConfig


@dataclass(frozen=True)
class Placement:
    """Where the engine trains and over how many ranks a copy of the states is sharded (checked before any
    collective)."""

    shard_ranks: int
    """S: the ranks each copy of the model states is sharded over (the world, unless hybrid sharding)."""
    layouts: list[UnitLayout]
    """The model's units, partitioned over S."""
    device: torch.device
    """Where the units' buffers and the model's buffers live."""
    control: torch.device
    """Where the step's control all-reduce and the order check run (the backend's device)."""


def placement(model: nn.Module, config: ZeroConfig, device: torch.device | None) -> Placement:
    """Everything that can be wrong with the input, checked; the model's buffers moved and the process group up."""
    shard_ranks = sharded_over(config, world_size_before_init())
    check_buckets(config, shard_ranks)
    layouts = build_units(model, config.unit_modules, config.no_weight_decay, shard_ranks)
    device = model_device(model, config, device)
    move_buffers(model, device)
    init_from_env(config.collective_timeout_seconds, device)
    control = device
    if dist.is_initialized():
        backend = str(dist.get_backend())
        check_backend_serves(backend, device)
        control = control_device(backend, device)
    return Placement(shard_ranks, layouts, device, control)


def groups(comm: Comm, shard_ranks: int, timeout: float) -> tuple[Comm, Comm | None]:
    """The shard group's collectives and, with hybrid sharding, the replica group's (one account of bytes)."""
    if shard_ranks == comm.world_size:
        return comm, None
    shard, across = hybrid_groups(shard_ranks)
    return Comm(timeout, shard, comm.stats), Comm(timeout, across, comm.stats)


def unit_context(
    config: ZeroConfig,
    dtypes: Dtypes,
    layouts: list[UnitLayout],
    device: torch.device,
    shard: Comm,
    across: Comm | None,
) -> UnitContext:
    """What every unit shares: its group, dtypes, the stage's policy, the bucket pool and the gradient arenas."""
    pool = BucketPool(shard)
    pool.streams = streams_for(device)
    ctx = UnitContext(
        shard,
        dtypes,
        ShardPolicy.of(config.fixed_stage),
        pool,
        config.reduce_bucket_elements,
        config.allgather_bucket_elements,
        accumulate_fp32=dtypes.compute != torch.float32 and config.gradient_accumulation_steps > 1,
        offload=config.offload.optimizer is not None,
        offload_parameters=config.offload.parameters is not None,
        across=across,
    )
    ctx.size_pool(layouts)
    if config.contiguous_gradients and ctx.policy.gradients:
        # Contiguous gradients: unsharded gradients in reused arenas (see `grad_arena`).
        trainable = [la for la in layouts if not la.frozen]
        ctx.arenas = GradArenas(trainable, dtypes.compute, device, pool, config.reduce_bucket_elements)
    return ctx


def make_units(
    ctx: UnitContext,
    model: nn.Module,
    layouts: list[UnitLayout],
    device: torch.device,
    source: ParameterSource,
    persistence: int,
    world: Comm,
) -> list[Unit]:
    """One `Unit` per layout, each filled with the range of its starting values this rank keeps (`source` reads
    them over `world`, every rank: with hybrid sharding the units' own group is one shard group); stage 3 keeps a
    unit of at most `persistence` elements gathered."""
    named = dict(model.named_parameters())
    units = []
    for i, layout in enumerate(layouts):
        lo, hi = kept_range(ctx, layout)
        values = torch.empty(hi - lo, dtype=torch.float32, device=device)
        source.fill(layout, lo, hi, values, world)
        params = [named[s.name] for s in layout.slots]
        units.append(build_unit(ctx, i, layout, params, values, persistence))
    return units


def build_optimizer(
    units: list[Unit], rank: int, factory: opt_mod.OptimizerFactory
) -> tuple[torch.optim.Optimizer, list[tuple[int, int, int]]]:
    """The wrapped optimizer over every unit's shard segments, and (unit, start, stop) in unit coordinates of each
    of its parameters in its order: what lets a checkpoint be loaded at another world size or stage."""
    shard_params = []
    where: dict[int, tuple[int, int, int]] = {}
    for u in units:
        lo = u.master_range[0]
        segs = u.optimizer_segments(rank)
        made = opt_mod.shard_params(u.master, u.step_grads, [(s.start, s.stop, s.kind) for s in segs])
        for s, (_, p) in zip(segs, made, strict=True):
            where[id(p)] = (u.index, lo + s.start, lo + s.stop)
        shard_params += made
    groups_ = opt_mod.param_groups(shard_params)
    opt = factory(groups_)
    opt_mod.check_uses_groups(opt, groups_)
    return opt, [where.get(id(p), (-1, 0, 0)) for g in opt.param_groups for p in g["params"]]


def prepare_modules(
    units: list[Unit], config: ZeroConfig, observe: Callable[[torch.Tensor], None], device: torch.device
) -> dict[str, str]:
    """zero.compile and activation checkpointing on the unit modules (a module's trainable unit and its frozen twin
    share it: it is compiled and checkpointed once); the units that run eagerly, with why."""
    named: dict[int, tuple[str, nn.Module]] = {}
    for u in units:
        if u.layout.module is not None:
            named.setdefault(id(u.layout.module), (u.name, u.layout.module))
    eager = compile_units(list(named.values())) if config.compile_units else {}
    if config.activation_checkpointing:
        apply_checkpointing([m for _, m in named.values()], config.offload_activation_checkpoints, observe, device)
    return eager
