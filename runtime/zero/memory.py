"""Bytes per category measured from the tensors the engine holds, next to the ZeRO formula's prediction.

Measured, per rank, from live storages (each storage counted once, in the first category that
holds it, so a view aliasing another buffer is never double counted):

- parameters: what stays allocated between steps - full compute buffers (stages 0-2) or the
  compute-dtype shard (stage 3). With fp32 compute the fp32 master *is* this storage.
- gathered: stage 3 full buffers allocated right now, and the peak since construction.
- gradients: flat gradient buffers, fp32 gradient shards and any unsharded `.grad` still alive.
- optimizer: every tensor in the optimizer's state plus a separate fp32 master (mixed precision only).
- activations: tensors autograd saved for backward in the last forward, and the peak (`saved`).
- communication buffers: the pool's fixed buffers for sending and receiving, now and at peak.
- gradient arenas: with contiguous gradients (stages 2/3), the reused buffers unsharded gradients land in.

Predicted: `zerotrain.plan.model_states.stage_bytes` with Ψ = the model's real elements, N = world size,
w = compute element size, g = element size of the gradients the stage holds between steps (the
compute dtype for stages 0/1, whose fp32 copy lives only from reduction to step; the fp32 shard
for stages 2/3) and K = per-element optimizer state bytes (measured once the optimizer has state;
Adam's 8 before) plus 4 for a separate fp32 master. So fp32 AdamW is K = 8 (with fp32 compute the
parameters are the master: no second copy exists, and none is counted), bf16 AdamW K = 12, as the
ZeRO paper counts. Frozen parameters count in Ψ but hold no gradient, master or optimizer state: those are
predicted for the trainable Ψ_t. Padding to a multiple of N is real memory, reported apart so a comparison can
allow for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from zerotrain._model import SpecModel
from zerotrain.plan.model_states import PlanInput, element_bytes, host_parameter_bytes, host_state_bytes, stage_bytes
from zerotrain.plan.peak import PeakInput, arena_bytes, comm_bytes_per_step, config_fields, gathered_bytes, pool_bytes
from zerotrain.runtime.zero import optimizer as opt_mod
from zerotrain.runtime.zero.collectives import CommStats
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.zero_config import Stage, ZeroConfig

if TYPE_CHECKING:
    from zerotrain.runtime.zero.activation_meter import SavedActivations
    from zerotrain.runtime.zero.unit_context import UnitContext


class MemoryReport(SpecModel):
    """One rank's memory by category, measured and predicted."""

    rank: int
    """This rank."""
    stage: Stage
    """ZeRO stage."""
    parameters: int
    """Ψ: real parameter elements of the model (padding excluded)."""
    world_size: int
    """Ranks in the job."""
    shard_group_size: int
    """N: the ranks the model states are sharded over (the world size, unless hybrid sharding groups fewer)."""
    padding_elements: int
    """Elements added to reach a multiple of N, summed over units (full buffers; a shard holds 1/N)."""
    parameter_bytes: int
    """Parameter storage held between steps (full buffers, or the shard in stage 3)."""
    gathered_bytes: int
    """Stage 3: gathered full parameters allocated now."""
    gathered_peak_bytes: int
    """Stage 3: most gathered full-parameter bytes alive at once since construction."""
    gradient_bytes: int
    """Gradient buffers, shards and live unsharded gradients."""
    optimizer_bytes: int
    """Optimizer state tensors plus a separate fp32 master copy, if any."""
    activation_bytes: int = 0
    """Activations the last forward saved for backward (checkpointed units: their inputs only)."""
    activation_peak_bytes: int = 0
    """Most activation bytes any forward saved since construction."""
    comm_buffer_bytes: int
    """Communication-only temporaries alive now."""
    comm_buffer_peak_bytes: int
    """Most communication-only bytes alive at once since construction."""
    unsharded_gradient_peak_bytes: int = 0
    """Most bytes of unsharded gradients alive at once in a backward: the flat gradient buffers (stages 0/1), the
    arenas (stages 2/3 with contiguous gradients), or autograd's own gradients awaiting their reduction."""
    cuda_allocated_bytes: int | None = None
    """CUDA only: bytes the caching allocator has handed out now (None on CPU)."""
    cuda_reserved_bytes: int | None = None
    """CUDA only: bytes the caching allocator holds from the device; reserved minus allocated is fragmentation."""
    cuda_peak_allocated_bytes: int | None = None
    """CUDA only: most bytes allocated at once since the process started."""
    cuda_alloc_retries: int | None = None
    """CUDA only: allocations that had to free cached blocks and retry (a sign of fragmentation)."""
    gradient_arena_bytes: int = 0
    """Contiguous gradients: the arenas unsharded gradients land in during backward (stages 2 and 3), held for
    the whole run and reused; not part of the model states."""
    model_state_bytes: int
    """parameter + gradient + optimizer bytes (the ZeRO paper's model states)."""
    bytes_per_weight: float
    """w used for the prediction."""
    bytes_per_gradient: float
    """g used for the prediction."""
    optimizer_multiplier: float
    """K used for the prediction."""
    predicted_parameter_bytes: int
    """Formula: w·Ψ, or w·Ψ/N in stage 3."""
    predicted_gradient_bytes: int
    """Formula: g·Ψ, or g·Ψ/N from stage 2."""
    predicted_optimizer_bytes: int
    """Formula: K·Ψ, or K·Ψ/N from stage 1."""
    predicted_model_state_bytes: int
    """Sum of the three predictions."""
    predicted_comm_buffer_peak_bytes: int = 0
    """The plan's communication pool (`zerotrain.plan.peak.pool_bytes`) for these units and bucket sizes."""
    predicted_gradient_arena_bytes: int = 0
    """The plan's gradient arenas (`zerotrain.plan.peak.arena_bytes`; 0 without contiguous gradients)."""
    predicted_gathered_peak_bytes: int = 0
    """The plan's stage-3 gathered window (`zerotrain.plan.peak.gathered_bytes`)."""
    host_optimizer_bytes: int = 0
    """Optimizer offload: the fp32 master and optimizer state this rank holds in host memory (0 otherwise)."""
    predicted_host_optimizer_bytes: int = 0
    """Formula: (K + 4)·Ψ/N in host memory under optimizer offload (the state and the fp32 master)."""
    host_parameter_bytes: int = 0
    """Parameter offload: the parameter shard this rank holds in host memory in the compute dtype (0 otherwise, and
    in fp32, where the offloaded master is that shard)."""
    predicted_host_parameter_bytes: int = 0
    """Formula: w·Ψ/N in host memory under parameter offload in bf16/fp16."""


@dataclass(frozen=True)
class BufferBytes:
    """The engine's buffers beyond the model states, in bytes, as each buffer's owner counts them."""

    gathered_peak: int
    """Stage 3: the most full parameter buffers gathered at once."""
    gradient_arenas: int
    """Contiguous gradients' arenas, kept for the whole run."""
    unsharded_gradient_peak: int
    """The most unsharded gradients alive at once in a backward."""
    activations: int
    """Activations the last forward saved for its backward."""
    activation_peak: int
    """The most any forward saved."""
    comm_buffers: int
    """Communication buffers held now."""
    comm_buffer_peak: int
    """The most communication buffers held at once."""


def held_buffer_bytes(
    ctx: UnitContext, unsharded: UnshardedGradients, activations: SavedActivations, stats: CommStats
) -> BufferBytes:
    """What the engine's buffers beyond the model states hold, and held at most, each counted by its owner."""
    return BufferBytes(
        gathered_peak=ctx.gathered_peak_bytes,
        gradient_arenas=ctx.arenas.nbytes if ctx.arenas is not None else 0,
        unsharded_gradient_peak=unsharded.peak_bytes,
        activations=activations.last_bytes,
        activation_peak=activations.peak_bytes,
        comm_buffers=stats.buffer_bytes,
        comm_buffer_peak=stats.peak_buffer_bytes,
    )


class StorageCounter:
    """Sums storage bytes, counting each storage once across categories."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def count(self, tensors: Iterable[torch.Tensor | None]) -> int:
        total = 0
        for t in tensors:
            if t is None:
                continue
            st = t.untyped_storage()
            key = st.data_ptr() if st.nbytes() else id(st)
            if key in self._seen or st.nbytes() == 0:
                continue
            self._seen.add(key)
            total += st.nbytes()
        return total


def predict(
    stage: Stage, psi: int, n: int, w: float, g: float, k: float, trainable: int | None = None
) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per rank the ZeRO formula predicts (gradients and optimizer state of
    the `trainable` elements only, when given)."""
    plan = PlanInput(
        parameters=psi,
        data_parallel=n,
        optimizer_multiplier=k,
        bytes_per_weight=w,
        bytes_per_gradient=g,
        trainable_parameters=trainable,
    )
    pb, gb, ob = stage_bytes(stage, plan)
    return round(pb), round(gb), round(ob)


class UnitTensors(Protocol):
    """What a report reads of one unit: its layout and the tensors it holds, per category."""

    @property
    def layout(self) -> UnitLayout: ...

    def parameter_tensors(self) -> list[torch.Tensor]: ...

    def gathered_tensors(self) -> list[torch.Tensor]: ...

    def gradient_tensors(self) -> list[torch.Tensor | None]: ...

    def master_tensors(self) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class Accounting:
    """What a memory report reads of an engine (`ZeroEngine.accounting()`): the rank, its configuration, and what
    it holds now."""

    rank: int
    """This rank."""
    world_size: int
    """Ranks in the job."""
    shard_ranks: int
    """N: the ranks the model states are sharded over."""
    config: ZeroConfig
    """The engine's configuration (stage, offload, precision, buckets)."""
    compute: torch.dtype
    """The compute dtype."""
    device: torch.device
    """Where the rank trains (CUDA adds the allocator's figures)."""
    units: Sequence[UnitTensors]
    """The units, each with its layout and tensors."""
    optimizer: torch.optim.Optimizer
    """The wrapped optimizer over this rank's shards (its state is counted; its kind gives K)."""
    held: BufferBytes
    """What the buffers beyond the model states hold now, and held at most."""
    comm: CommStats
    """The rank's collectives, counted (`collectives`)."""
    prefetches: int = 0
    """Stage 3 gathers issued ahead of need so far (they overlap the running unit's compute)."""
    unit_in_progress: str | None = None
    """The unit whose forward or backward is running (where an out-of-memory struck)."""

    def memory_report(self) -> MemoryReport:
        """Bytes per category held by this rank now, next to the ZeRO formula's prediction."""
        return memory_report(self)

    def planned_comm(self) -> dict[str, int]:
        """Bytes per optimizer step by op the plan says this rank's collectives send (`zerotrain.plan.peak`)."""
        return planned_comm(self)

    def comm_report(self) -> dict[str, dict[str, float]]:
        """Per collective op: calls, bytes (ring convention, see `collectives`), payload bytes and seconds."""
        self.comm.settle()
        return {op: dict(vars(s)) for op, s in self.comm.ops.items()}


def buffer_plan(view: Accounting, w: float, g: float, k: float) -> PeakInput:
    """The whole-peak plan's input for an engine's own units and configuration (activations left out): per block
    module, its trainable unit and its frozen twin."""
    layouts = [u.layout for u in view.units]
    blocks: dict[int, list[int]] = {}
    for la in layouts:
        if la.module is not None:
            blocks.setdefault(id(la.module), [0, 0])[int(la.frozen)] += la.padded
    frozen = [f for _, f in blocks.values()]
    return PeakInput(
        **config_fields(view.config),
        world_size=view.shard_ranks,
        shard_groups=view.world_size // view.shard_ranks,
        blocks=[t for t, _ in blocks.values()],
        root=sum(la.padded for la in layouts if la.module is None and not la.frozen),
        frozen_blocks=frozen if any(frozen) else [],
        frozen_root=sum(la.padded for la in layouts if la.module is None and la.frozen),
        compute_bytes=w,
        gradient_bytes=g,
        state_bytes=k,
    )


def planned_comm(view: Accounting) -> dict[str, int]:
    """Bytes per optimizer step by op the plan says this rank's collectives send (`zerotrain.plan.peak`)."""
    compute = float(torch.empty(0, dtype=view.compute).element_size())
    return comm_bytes_per_step(buffer_plan(view, compute, compute, 0.0))


def memory_report(view: Accounting) -> MemoryReport:
    """Bytes per category the engine's rank holds now, next to the ZeRO formula's prediction."""
    c = StorageCounter()
    units = view.units
    offload, off_params = view.config.offload.optimizer is not None, view.config.offload.parameters is not None
    state = [t for st in view.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    # Without offload an fp32 master is the parameters themselves (counted there, first); offloaded, it is a host
    # buffer of its own, or in fp32 with the parameters offloaded the host shard itself (counted here, first).
    opt_bytes = c.count(state) + c.count(t for u in units for t in u.master_tensors()) if offload else 0
    params = c.count(t for u in units for t in u.parameter_tensors())
    gathered = c.count(t for u in units for t in u.gathered_tensors())
    grads = c.count(t for u in units for t in u.gradient_tensors())
    if not offload:
        opt_bytes = c.count(state) + c.count(t for u in units for t in u.master_tensors())
    host_opt, opt_bytes = (opt_bytes, 0) if offload else (0, opt_bytes)
    host_params, params = (params, 0) if off_params else (0, params)
    # K from the configuration, never from what is allocated (a prediction that measured itself would always
    # agree); an optimizer kind we do not know is measured, and assumed Adam's 8 before its first step.
    per_element = opt_mod.configured_state_bytes(view.optimizer)
    if per_element is None:
        per_element = opt_mod.state_bytes_per_element(view.optimizer)
    compute = float(torch.empty(0, dtype=view.compute).element_size())
    # The same rule `zerotrain plan`, validate and the operator's admission apply to the job spec.
    state_bytes = 8.0 if per_element is None else per_element
    w, g, k = element_bytes(view.config.fixed_stage, compute, state_bytes, offload, off_params)
    psi = sum(u.layout.numel for u in units)
    trainable = sum(u.layout.numel for u in units if not u.layout.frozen)
    pp, pg, po = predict(view.config.fixed_stage, psi, view.shard_ranks, w, g, k, trainable)
    host_k = host_state_bytes(state_bytes, offload)
    host_w = host_parameter_bytes(compute, off_params)
    buffers = buffer_plan(view, compute, g, k)
    held = view.held
    return MemoryReport(
        rank=view.rank,
        stage=view.config.fixed_stage,
        parameters=psi,
        world_size=view.world_size,
        shard_group_size=view.shard_ranks,
        padding_elements=sum(u.layout.padded - u.layout.numel for u in units),
        parameter_bytes=params,
        gathered_bytes=gathered,
        gathered_peak_bytes=held.gathered_peak,
        gradient_bytes=grads,
        optimizer_bytes=opt_bytes,
        activation_bytes=held.activations,
        activation_peak_bytes=held.activation_peak,
        comm_buffer_bytes=held.comm_buffers,
        comm_buffer_peak_bytes=held.comm_buffer_peak,
        gradient_arena_bytes=held.gradient_arenas,
        unsharded_gradient_peak_bytes=held.unsharded_gradient_peak,
        **cuda_allocator(view.device),
        model_state_bytes=params + grads + opt_bytes,
        bytes_per_weight=w,
        bytes_per_gradient=g,
        optimizer_multiplier=k,
        predicted_parameter_bytes=pp,
        predicted_gradient_bytes=pg,
        predicted_optimizer_bytes=po,
        predicted_model_state_bytes=pp + pg + po,
        predicted_comm_buffer_peak_bytes=pool_bytes(buffers),
        predicted_gradient_arena_bytes=arena_bytes(buffers),
        predicted_gathered_peak_bytes=gathered_bytes(buffers),
        host_optimizer_bytes=host_opt,
        predicted_host_optimizer_bytes=round(host_k * trainable / view.shard_ranks),
        host_parameter_bytes=host_params,
        predicted_host_parameter_bytes=round(host_w * psi / view.shard_ranks),
    )


def cuda_allocator(device: torch.device) -> dict[str, int | None]:
    """The caching allocator's figures for the report's cuda_* fields (all None on CPU)."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {
        "cuda_allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "cuda_reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "cuda_peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "cuda_alloc_retries": int(stats.get("num_alloc_retries", 0)),
    }


class UnshardedGradients:
    """Bytes of unsharded gradients alive during backward: each unit's from when its gradients are ready until its
    reduction has dropped them (stages 2/3), or held throughout (stages 0/1, and the arenas)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak_bytes = 0

    def add(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live)

    def drop(self, nbytes: int) -> None:
        self.live -= nbytes
