"""One small class per ZeRO stage, saying only what differs: what is held, how gradients are reduced,
and how updated parameters get back to every rank.

| stage | held per rank                      | gradient reduction                          | after the step    |
|-------|------------------------------------|---------------------------------------------|-------------------|
| 0     | params, grads, opt state           | all-reduce at the accumulation boundary     | nothing           |
| 1     | params, grads, opt state / N       | reduce-scatter at the accumulation boundary | all-gather params |
| 2     | params, grads / N, opt state / N   | reduce-scatter every micro-batch, free      | all-gather params |
| 3     | params / N, grads / N, opt st. / N | reduce-scatter every micro-batch, free      | nothing           |

Stages 0 and 1 let autograd accumulate straight into a flat gradient buffer (`.grad` are views) and
communicate once per optimizer step; stages 2 and 3 cannot hold full gradients, so every micro-batch
is reduce-scattered into the fp32 gradient shard and the unsharded gradients are dropped.

Averaging: gloo has no AVG/PREMUL_SUM, so ranks SUM and the result is divided by N afterwards; when
the reduce dtype is fp16 the division happens before the sum instead, so the sum cannot overflow.
With fp32 compute the fp32 master is the parameter storage itself (no second copy is held).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from zerotrain.runtime.collectives import Comm, Pending
from zerotrain.runtime.config import Stage
from zerotrain.runtime.flat_buffer import FlatBuffer, flatten_grads
from zerotrain.runtime.partition import UnitLayout


@dataclass
class Dtypes:
    """Compute (parameters and their gradients) and reduction dtypes; masters are always fp32."""

    compute: torch.dtype
    reduce: torch.dtype


@dataclass
class UnitState:
    """Buffers and per-backward bookkeeping of one unit."""

    index: int
    layout: UnitLayout
    params: list[nn.Parameter]
    full: FlatBuffer
    master: torch.Tensor
    grad_shard: torch.Tensor
    shard: torch.Tensor | None = None
    grad_full: FlatBuffer | None = None
    resident: bool = True
    gather: Pending | None = None
    grads_left: int = 0
    reduced: bool = False
    pending: list[tuple[Pending, Callable[[], None]]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def trainable_count(self) -> int:
        return sum(1 for p in self.params if p.requires_grad)

    @property
    def has_frozen(self) -> bool:
        return any(not p.requires_grad for p in self.params)


class Strategy:
    """Stage 0: plain data parallelism."""

    stage = Stage.DATA_PARALLEL
    shards_optimizer = False
    reduce_every_micro_batch = False

    def __init__(self, comm: Comm, dtypes: Dtypes) -> None:
        self.comm, self.dtypes = comm, dtypes
        self.n = comm.world_size

    @property
    def _mixed(self) -> bool:
        return self.dtypes.compute != torch.float32

    def build(self, index: int, layout: UnitLayout, params: list[nn.Parameter], init: torch.Tensor) -> UnitState:
        """Buffers of one unit, from `init` (its fp32 flat values, identical on every rank)."""
        full = FlatBuffer(layout, self.dtypes.compute, init.device)
        full.data.copy_(init)
        full.bind(params)
        grad_full = FlatBuffer(layout, self.dtypes.compute, init.device)
        grad_full.bind_grads(params)
        lo, hi = self._master_range(layout)
        master = init[lo:hi].clone() if self._mixed else full.data[lo:hi]
        grad_shard = torch.zeros_like(master) if self._mixed else grad_full.data[lo:hi]
        return UnitState(index, layout, params, full, master, grad_shard, grad_full=grad_full)

    def _fp32_grads(self, u: UnitState) -> torch.Tensor:
        """The fp32 gradient shard, its storage allocated (stages 0/1 in mixed precision free it between steps)."""
        st = u.grad_shard.untyped_storage()
        if st.nbytes() == 0:
            st.resize_(u.grad_shard.numel() * u.grad_shard.element_size())
            u.grad_shard.zero_()
        return u.grad_shard

    def _master_range(self, layout: UnitLayout) -> tuple[int, int]:
        return (0, layout.padded) if not self.shards_optimizer else layout.shard_range(self.comm.rank)

    def _pre(self, t: torch.Tensor) -> None:
        if self.dtypes.reduce == torch.float16 and self.n > 1:
            t.div_(self.n)

    def _post(self, t: torch.Tensor) -> None:
        if self.dtypes.reduce != torch.float16 and self.n > 1:
            t.div_(self.n)

    def _comm_copy(self, src: torch.Tensor) -> torch.Tensor:
        """`src` itself when it already has the reduce dtype, else a counted comm-buffer copy."""
        if src.dtype == self.dtypes.reduce:
            return src
        buf = src.to(self.dtypes.reduce)
        self.comm.stats.hold(buf)
        return buf

    def reduce(self, u: UnitState, async_op: bool) -> None:
        """Launch the unit's gradient reduction (called at the accumulation boundary only)."""
        assert u.grad_full is not None
        buf = self._comm_copy(u.grad_full.data)
        self._pre(buf)
        work = self.comm.all_reduce(buf, u.name, async_op=async_op)

        def finish() -> None:
            self._post(buf)
            if buf.data_ptr() != u.grad_shard.data_ptr():
                self._fp32_grads(u).copy_(buf)
            if u.grad_full is not None and buf.data_ptr() != u.grad_full.data.data_ptr():
                self.comm.stats.release(buf)

        u.pending.append((work, finish))

    def zero_grads(self, u: UnitState) -> None:
        if u.grad_full is not None:
            u.grad_full.data.zero_()
            if self._mixed:
                # Mixed precision keeps the full gradients in the compute dtype; the fp32 copy the optimizer
                # reads exists only from the reduction to the end of the step (as in DeepSpeed).
                u.grad_shard.untyped_storage().resize_(0)
                return
        u.grad_shard.zero_()

    def after_step(self, u: UnitState) -> None:
        """Bring the updated master values back into the compute parameters."""
        if self._mixed:
            u.full.data.copy_(u.master)


class OptimizerStatesStrategy(Strategy):
    """Stage 1: each rank steps only its shard; one reduce-scatter per optimizer step, then all-gather."""

    stage = Stage.OPTIMIZER_STATES
    shards_optimizer = True

    def reduce(self, u: UnitState, async_op: bool) -> None:
        assert u.grad_full is not None
        full = self._comm_copy(u.grad_full.data)
        self._reduce_scatter(u, full, accumulate=False, async_op=async_op)

    def _reduce_scatter(self, u: UnitState, full: torch.Tensor, accumulate: bool, async_op: bool) -> None:
        self._pre(full)
        out = torch.empty(u.layout.shard_numel, dtype=self.dtypes.reduce, device=full.device)
        self.comm.stats.hold(out)
        work = self.comm.reduce_scatter(out, full, u.name, async_op=async_op)

        def finish() -> None:
            self._post(out)
            if accumulate:
                u.grad_shard.add_(out)
            else:
                self._fp32_grads(u).copy_(out)
            self.comm.stats.release(out)
            if u.grad_full is None or full.data_ptr() != u.grad_full.data.data_ptr():
                self.comm.stats.release(full)

        u.pending.append((work, finish))

    def after_step(self, u: UnitState) -> None:
        shard = u.master.to(self.dtypes.compute, copy=True)
        self.comm.stats.hold(shard)
        self.comm.all_gather(u.full.data, shard, u.name)
        self.comm.stats.release(shard)


class GradientsStrategy(OptimizerStatesStrategy):
    """Stage 2: gradients are reduce-scattered every micro-batch into the fp32 shard and dropped."""

    stage = Stage.GRADIENTS
    reduce_every_micro_batch = True

    def build(self, index: int, layout: UnitLayout, params: list[nn.Parameter], init: torch.Tensor) -> UnitState:
        full = FlatBuffer(layout, self.dtypes.compute, init.device)
        full.data.copy_(init)
        full.bind(params)
        lo, hi = layout.shard_range(self.comm.rank)
        master = init[lo:hi].clone() if self._mixed else full.data[lo:hi]
        return UnitState(index, layout, params, full, master, torch.zeros(hi - lo, device=init.device))

    def reduce(self, u: UnitState, async_op: bool) -> None:
        buf = torch.empty(u.layout.padded, dtype=self.dtypes.reduce, device=u.master.device)
        self.comm.stats.hold(buf)
        flatten_grads(u.layout, u.params, buf)
        self._reduce_scatter(u, buf, accumulate=True, async_op=async_op)


class ParametersStrategy(GradientsStrategy):
    """Stage 3: only the shard is held; the full buffer is allocated while a unit is gathered."""

    stage = Stage.PARAMETERS

    def build(self, index: int, layout: UnitLayout, params: list[nn.Parameter], init: torch.Tensor) -> UnitState:
        full = FlatBuffer(layout, self.dtypes.compute, init.device)
        full.bind(params)
        lo, hi = layout.shard_range(self.comm.rank)
        shard = init[lo:hi].to(self.dtypes.compute, copy=True)
        master = init[lo:hi].clone() if self._mixed else shard
        full.free()
        grad_shard = torch.zeros(hi - lo, device=init.device)
        return UnitState(index, layout, params, full, master, grad_shard, shard=shard, resident=False)

    def after_step(self, u: UnitState) -> None:
        assert u.shard is not None
        if self._mixed:
            u.shard.copy_(u.master)
        if u.resident and u.full.allocated:
            self.comm.all_gather(u.full.data, u.shard, u.name)


STRATEGIES: dict[Stage, type[Strategy]] = {
    Stage.DATA_PARALLEL: Strategy,
    Stage.OPTIMIZER_STATES: OptimizerStatesStrategy,
    Stage.GRADIENTS: GradientsStrategy,
    Stage.PARAMETERS: ParametersStrategy,
}
