"""`ZeroEngine`: orchestration only. Layout in `partition`; each unit's lifecycle in `unit`, by the paths it chose
once (`unit_paths`); what `__init__` builds in `engine_build`; when to gather and reduce in `hooks` and `schedule`;
collectives in `collectives` (the group in `process_group`), buckets in `buckets`, streams in `streams`, accounting
in `memory`, divergence detection in `consistency`. Files are the checkpointer's (`runtime.checkpoints`): the engine
gives and takes its state (`state_dict`, `load_state_dict`) and knows nothing of them.

Contract for callers:
- The engine trains where the model is, as DDP does: move the model to its GPU before wrapping it.
- Every micro-batch: `out = engine(x)`, `engine.backward(loss)`; then `engine.step()`, which only updates at the
  gradient-accumulation boundary (every `gradient_accumulation_steps` backward calls) and returns a `StepResult`
  saying whether it did. One forward, then its backward.
- `backward` divides the loss by `gradient_accumulation_steps`, and gradients are averaged over ranks: with equal
  per-rank batch sizes the update uses exactly the gradient of the mean loss over the global batch. A loss given as
  a sum over counted tokens (`backward(loss, tokens=n)`) is exact whatever each micro-batch counts: the step divides
  the gradients by the tokens every rank and micro-batch counted, as one process computes the mean.
- Collectives, so call them on every rank: forward (stage 3), backward, step (one small control all-reduce that
  also carries the loss mean, votes and the divergence check), `full_state_dict()`, and checkpoint save/load.
- Stages 1/2 gather the updated parameters after the step asynchronously; forward waits for each unit before it
  runs. Call `synchronize()` before reading the module's parameters directly between a step and a forward.
- The model's parameters become views into the engine's flat buffers: do not move or re-create them after
  wrapping, and in stage 3 read weights through `full_state_dict()` (outside a unit's forward or backward its
  parameters hold no storage).
- Hybrid sharding (`shardGroupSize`): the states are sharded over groups of S consecutive ranks, every group a
  replica. Collectives inside a unit run on the group; the accumulated gradient shard is averaged across groups at
  the boundary (`unit_comm.across_groups`).
- Save and resume: `zerotrain.runtime.save_checkpoint(engine, dir)` / `load_checkpoint(engine, path)` (at any
  world size or stage), or let `checkpoints.checkpointer.Checkpointer` decide when.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from zerotrain.runtime.zero import control
from zerotrain.runtime.zero import optimizer as opt_mod
from zerotrain.runtime.zero.activation_meter import SavedActivations
from zerotrain.runtime.zero.buffers import ModelBuffers
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.consistency import Event, OrderCheck, PassChecks
from zerotrain.runtime.zero.control import token_factor
from zerotrain.runtime.zero.engine_build import (
    build_optimizer,
    groups,
    make_units,
    placement,
    prepare_modules,
    unit_context,
)
from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.engine_state import (
    EngineState,
    Position,
    ShardLayout,
    StepResult,
    full_values,
    load_problem,
    shard_layout,
)
from zerotrain.runtime.zero.hooks import GradReadyHooks, Prefetcher, install_unit_hooks
from zerotrain.runtime.zero.memory import (
    Accounting,
    UnshardedGradients,
    held_buffer_bytes,
)
from zerotrain.runtime.zero.param_source import ModelValues, ParameterSource
from zerotrain.runtime.zero.precision import DTYPES, LossScaler, cast_inputs
from zerotrain.runtime.zero.schedule import ReductionSchedule, gather_order
from zerotrain.runtime.zero.unit import GradState, Unit
from zerotrain.runtime.zero.unit_context import Dtypes
from zerotrain.zero_config import DivergenceCheck, GradientSync, Precision, ZeroConfig


class ZeroEngine:
    """ZeRO stages 0-3 over flat partitioned buffers for one data-parallel model replica per rank."""

    def __init__(
        self,
        model: nn.Module,
        config: ZeroConfig,
        optimizer: opt_mod.OptimizerFactory,
        *,
        init: ParameterSource | None = None,
        device: torch.device | None = None,
        samples_per_rank_batch: int = 0,
    ) -> None:
        """`init`: where the units' starting values come from (default: the model's own parameters, rank 0's on
        every rank); `device`: where to train (default: where the model's parameters are; required when they are
        placeholders on the meta device, as a partitioned construction leaves them); `samples_per_rank_batch`: the
        samples in one of this rank's micro-batches, when whoever feeds the data knows it (0: unknown), so that
        checkpoints record the data position."""
        self.config, self.module = config, model
        # Everything that can be wrong with the input is checked before the first collective.
        opt_mod.check_factory(optimizer)
        place = placement(model, config, device)
        self._shard_ranks, layouts, device = place.shard_ranks, place.layouts, place.device
        """S: the ranks each copy of the model states is sharded over (the world, unless hybrid sharding)."""
        self.comm = Comm(config.collective_timeout_seconds)
        """Every rank: the step's control all-reduce, the divergence check, broadcasts and checkpoints."""
        self._rank, self._world_size = self.comm.rank, self.comm.world_size
        self._replica = self._rank // self._shard_ranks
        """Which copy of the model states this rank's shard group holds (always 0 without hybrid sharding)."""
        self._dtypes = Dtypes(DTYPES[config.precision], DTYPES[config.reduce_dtype])
        self.device = device
        shard, across = groups(self.comm, self._shard_ranks, config.collective_timeout_seconds)
        self._ctx = unit_context(config, self._dtypes, layouts, device, shard, across)
        persistence = config.param_persistence_elements
        self.units: list[Unit] = make_units(
            self._ctx, model, layouts, device, init or ModelValues(model), persistence, self.comm
        )
        self._buffers = ModelBuffers(model, self.comm, config.broadcast_buffers)
        """The model's persistent buffers (BatchNorm statistics, counters): kept, saved, broadcast (`buffers`)."""
        self._buffers.sync()
        self._roots = [u for u in self.units if u.layout.module is None]
        """The root unit and its frozen twin: what no unit module claims (stage 3 keeps them gathered into backward)."""
        each = config.gradient_sync is GradientSync.EVERY_MICRO_BATCH
        self._reduce_each = self._ctx.policy.gradients and each
        """Sharded gradients are reduced (and freed) every micro-batch, unless told to sync only at the boundary."""
        self.optimizer, self._optimizer_segments = build_optimizer(self.units, self._ctx.comm.rank, optimizer)
        self._zero_grads()  # views exist now; buffers a stage holds only during a step can go
        self._scaler = LossScaler(config.loss_scale, enabled=config.precision is Precision.FP16)
        self._prefetcher = Prefetcher(self.units, config.prefetch_units)
        checks = self._world_size > 1 and config.divergence_check is not DivergenceCheck.OFF
        order = OrderCheck(self.comm, [u.name for u in self.units], place.control) if checks else None
        every_pass = config.divergence_check is DivergenceCheck.EVERY_PASS
        self._checks = PassChecks(order, every_pass, self._prefetcher.active)
        copies = self._world_size // self._shard_ranks
        accumulation, shards = config.gradient_accumulation_steps, self._ctx.policy.optimizer
        self._control = control.StepControl(self.comm, order, accumulation, shards, copies)
        self._forward_order: list[int] = []
        self._schedule = ReductionSchedule([u.index for u in self.units if not u.layout.frozen], self._reduce)
        self._activations = SavedActivations()
        self._install_hooks()
        self._unsharded_gradients = UnshardedGradients()
        self.micro_steps = 0
        self.steps = 0
        self._stepped_at = -1  # micro_steps at the last step: a boundary is stepped once
        self._samples_per_micro_batch = samples_per_rank_batch * self._world_size
        """Global samples in one micro-batch (0: unknown): checkpoints record the position."""
        self._unit_in_progress: str | None = None
        """The unit whose forward last began or whose gradients last completed: where a failure happened."""
        self._boundary = False
        if device.type == "cuda":
            # The model's own unsharded parameters and the broadcast buffers are gone now; without this the caching
            # allocator keeps their blocks reserved (~28 GB for gpu-7b), reported as used and counted by the alert.
            torch.cuda.empty_cache()

    # ----------------------------------------------------------------- setup (engine_build)

    def _install_hooks(self) -> None:
        self._prefetcher.install()
        self._eager_units = prepare_modules(self.units, self.config, self._activations.observe, self.device)
        """zero.compile: units whose forward did not compile to one graph, with why (they run eagerly)."""
        self._grad_hooks = GradReadyHooks(self.units, self._on_grads_ready)
        install_unit_hooks(self.units, self._ctx.arenas, self._on_forward)

    # ----------------------------------------------------------------- forward / backward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward; in stage 3 each unit is gathered just before it runs and freed after."""
        args, kwargs = cast_inputs(args, kwargs, self._dtypes.compute)
        self._buffers.sync()  # rank 0's running statistics on every rank, as DDP's broadcast_buffers
        self._forward_order = []
        for root in self._roots:
            root.wait_for_unshard()  # stages 1/2: the post-step gather; block units wait in their pre-hook
        self._prefetcher.begin_forward(self._roots)
        with self._activations.measure(self._parameter_storages()):
            out = self.module(*args, **kwargs)
        self._checks.end_forward()  # before any gradient collective: a rank that ran other units fails, named
        return self._prefetcher.end_forward(self._roots, out)

    def _parameter_storages(self) -> set[int]:
        # Storage identities, not data pointers: a stage-3 buffer gathered during the forward gets a new pointer
        # in the same storage, and must still be left out of the activations.
        return {
            t.untyped_storage()._cdata for u in self.units for t in (u.full.data, u.shard, u.master) if t is not None
        }

    def _on_forward(self, unit: int) -> None:
        self._unit_in_progress = self.units[unit].name
        self.units[unit].wait_for_unshard()
        self._forward_order.append(unit)
        self._checks.note(Event.FORWARD, unit)

    def _on_grads_ready(self, u: Unit) -> None:
        self._unit_in_progress = u.name
        self._checks.note(Event.GRADS_READY, u.index)
        u.unsharded_bytes = u.unsharded_grad_bytes()
        self._unsharded_gradients.add(u.unsharded_bytes)
        self._schedule.mark_ready(u.index)

    def _reduce(self, index: int) -> None:
        u = self.units[index]
        if u.grads_state is GradState.REDUCING:
            return
        # Off the boundary with gradientSync: boundary the gradients stay unsharded; the parameters are freed anyway.
        if self._boundary or self._reduce_each:
            self._unsharded_gradients.drop(u.reduce(self.config.overlap_comm, self._boundary))
        u.reshard()  # its gradients are complete, so autograd is done with its parameters

    def backward(self, loss: torch.Tensor, tokens: torch.Tensor | float | None = None) -> None:
        """Backward of `loss / gradient_accumulation_steps` (times the fp16 loss scale) and gradient reduction.

        `tokens`: `loss` is a sum over that many counted tokens (or items), not a mean; the step then divides the
        gradients by the count over every rank and micro-batch. Dividing the sum and the count by one fixed figure
        (the micro-batch's positions, say) changes nothing but keeps the gradients' magnitude that of a mean, which
        an fp16 loss scale wants."""
        self._boundary = (self.micro_steps + 1) % self.config.gradient_accumulation_steps == 0
        self._checks.finish_forward()
        GradReadyHooks.arm([u for u in self.units if not u.layout.frozen])
        self._schedule.begin(self._forward_order)
        self._unsharded_gradients.live = 0  # a new backward: stages 0/1 count their flat buffers again as ready
        self._prefetcher.begin_backward()
        for u in self.units:
            u.prepare_backward()
        scale = self._scaler.scale / self.config.gradient_accumulation_steps
        self._control.note_loss(loss, tokens)
        (loss * scale).backward()
        # Units some parameters of which got no gradient: reduce them now, in schedule order. The check
        # comes after, so a rank whose backward skipped units still issues every collective the others did.
        self._schedule.finish(before=self._prefetcher.replay_pre_backward)
        self._checks.end_backward(reduced=self._boundary or self._reduce_each)
        self._ctx.pool.drain()
        self._ctx.pool.streams.join()
        for u in self.units:
            u.reshard()
            u.end_backward(self._boundary)
        self.micro_steps += 1

    def train(self, mode: bool = True) -> ZeroEngine:
        """Set the model's training mode (dropout etc.), as `nn.Module.train`."""
        self.module.train(mode)
        return self

    def eval(self) -> ZeroEngine:
        """Evaluation mode; run evaluation forwards under `torch.no_grad()` on every rank."""
        return self.train(False)

    def _is_accumulation_boundary(self) -> bool:
        """True when the next `step()` will update (all micro-batches of this step are in)."""
        return self.micro_steps % self.config.gradient_accumulation_steps == 0 and self.micro_steps > 0

    # ----------------------------------------------------------------- step

    def step(self, vote: bool = False, report_grad_norm: bool = False, written: bool = False) -> StepResult:
        """At the accumulation boundary: unscale, agree (loss, votes, norm, divergence check), clip, optimizer step
        on the shard, start gathering the updated parameters. `vote` and `written` are counted over ranks in
        `StepResult.votes` and `.written`; the gradient norm is computed when clipping or fp16 needs it, or
        `report_grad_norm` asks."""
        if not self._is_accumulation_boundary() or self._stepped_at == self.micro_steps:
            return StepResult(applied=False, loss_scale=self._scaler.scale)
        self._stepped_at = self.micro_steps
        self.synchronize()  # a unit no forward reached may still be gathering into its buffer
        self._checks.finish_forward()
        scale = self._scaler.scale
        self._offload_grads()
        grads = [u.step_grads for u in self.units]
        if scale != 1.0:
            torch._foreach_div_(grads, scale)  # one kernel launch per tensor list, not one per unit
        clip = self.config.gradient_clipping
        need_norm = report_grad_norm or clip is not None or self._scaler.enabled
        agreed, norm = self._control.agree(self.units, vote, need_norm, written)
        factor = token_factor(agreed.tokens, self._world_size, self.config.gradient_accumulation_steps)
        if norm is not None:
            norm *= factor
        done = StepResult(False, norm, loss_scale=scale, loss=agreed.loss, votes=agreed.votes, written=agreed.written)
        if self._scaler.update(overflow=norm is not None and not math.isfinite(norm)):
            self._zero_grads()
            done.overflow = True
            return done
        if clip is not None and norm is not None:
            factor *= min(1.0, clip / (norm + 1e-6))
        if factor != 1.0:
            torch._foreach_mul_(grads, factor)
        self.optimizer.step()
        self._zero_grads()
        for i in gather_order([r.index for r in self._roots], self._forward_order, len(self.units)):
            if not self.units[i].layout.frozen:  # nothing changed a frozen unit's values
                self.units[i].after_step(async_op=self.config.overlap_comm)
        self.steps += 1
        self.comm.stats.settle()  # completed CUDA timings (none on CPU): the list stays one step long
        done.applied = True
        return done

    def _offload_grads(self) -> None:
        """Optimizer offload: the reduced shards out to the host, where the optimizer steps (one wait on CUDA)."""
        if not self._ctx.offload:
            return
        for u in self.units:
            u.offload_grads()
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    def synchronize(self) -> None:
        """Wait for parameter gathers still in flight (stages 1/2 after a step), e.g. before reading the module's
        parameters directly; forward, checkpoints and `full_state_dict` do it themselves."""
        for u in self.units:
            u.wait_for_unshard()

    def refresh_parameters(self) -> None:
        """Rebuild every unit's compute parameters from its fp32 master now (after a checkpoint wrote the masters)."""
        for u in self.units:
            u.after_step(async_op=False)

    def _restore_counters(self, steps: int, micro_steps: int) -> None:
        """Continue from a checkpoint's counters: `steps` applied, `micro_steps` consumed, that boundary stepped."""
        self.steps, self.micro_steps = steps, micro_steps
        self._stepped_at = micro_steps

    def _zero_grads(self) -> None:
        for u in self.units:
            u.zero_grads()

    # ----------------------------------------------------------------- state and checkpoints

    @functools.cached_property
    def layout(self) -> ShardLayout:
        """Where this rank's shards sit in the model (fixed once the engine is built)."""
        where = (self._rank, self._world_size, self._shard_ranks, self._replica)
        return shard_layout(self.units, where, self.config, self._optimizer_segments, self._buffers, self.module)

    def state_dict(self) -> EngineState:
        """This rank's training state: its shards (views of the engine's own buffers), counters, loss scaler and
        layout. No collective; a gather still in flight is waited for first."""
        self.synchronize()
        position = Position(
            self.steps, self.micro_steps, self.config.gradient_accumulation_steps, self._samples_per_micro_batch
        )
        return EngineState(
            layout=self.layout,
            masters=[u.master for u in self.units],
            optimizer=self.optimizer.state_dict(),
            buffers=self._buffers.tensors(),
            position=position,
            scaler=self._scaler.state_dict(),
        )

    def load_state_dict(self, state: EngineState) -> None:
        """Continue from `state`, a state of this engine's own layout (one saved at another world size or stage
        loads through `checkpoints.checkpoint.load`, which reshards); then rebuild the compute parameters. Masters
        and buffers are copied in (masters that are this engine's own, filled in place, are not copied again); the
        optimizer state's tensors are taken as they are, as the wrapped optimizer's own `load_state_dict` takes
        them. A state that does not fit is refused before anything changes."""
        groups = [len(g["params"]) for g in self.optimizer.param_groups]
        problem = load_problem(self.layout, [u.master for u in self.units], groups, state)
        if problem is not None:
            where = f"rank {state.layout.rank} of {state.layout.world_size}"
            fix = "load a checkpoint through checkpoints.checkpoint.load(), which reads any world size or stage"
            raise ZeroSetupError("state", where, problem, fix)
        self.synchronize()  # a gather the last step left in flight would overwrite what the load writes
        with torch.no_grad():
            for u, master in zip(self.units, state.masters, strict=True):
                if master.data_ptr() != u.master.data_ptr():
                    u.master.copy_(master)
        self.optimizer.load_state_dict(state.optimizer)
        if state.buffers is not None:
            self._buffers.load(state.buffers)
        self._restore_counters(state.position.steps, state.position.micro_steps)
        self._scaler.load_state_dict(state.scaler)
        self.refresh_parameters()

    # ----------------------------------------------------------------- reports

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded fp32 parameters by name (tied parameters under every name) and rank 0's persistent buffers: what
        the model's own `state_dict()` holds; a collective on every rank."""
        self.synchronize()
        return full_values(self.units, self.module) | self._buffers.rank0_values()

    def accounting(self) -> Accounting:
        """What this rank holds and has sent, for the memory and communication reports."""
        return Accounting(
            self._rank,
            self._world_size,
            self._shard_ranks,
            self.config,
            self._dtypes.compute,
            self.device,
            self.units,
            self.optimizer,
            held_buffer_bytes(self._ctx, self._unsharded_gradients, self._activations, self.comm.stats),
            self.comm.stats,
            self._prefetcher.prefetches,
            self._unit_in_progress,
        )
