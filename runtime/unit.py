"""One partition unit's state: its buffers, and where its parameters and gradients are in their lifecycles.

Two explicit states, as FSDP2 keeps a sharded state apart from its training state, each changed only through
`move_*`, which refuses a transition the lifecycle does not have (a bug, named, instead of a silent wrong buffer):

    parameters   SHARDED ──gather issued──▶ GATHERING ──gather done──▶ GATHERED ──freed──▶ SHARDED
                 (stages 1/2 and resident stage-3 units: the step updates the shard, so GATHERED ──step──▶
                 SHARDED, and the post-step gather runs while the next forward reaches the unit)

    gradients    IDLE ──backward starts──▶ ACCUMULATING ──all .grad in──▶ READY ──reduction issued──▶ REDUCING
                 REDUCING ──next backward──▶ ACCUMULATING;  any ──step (grads consumed)──▶ IDLE

Whether a unit is gathered is read from this state, never inferred from a storage's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn

from zerotrain.runtime.collectives import Pending
from zerotrain.runtime.flat_buffer import FlatBuffer
from zerotrain.runtime.partition import UnitLayout


class ParamState(str, Enum):
    """Where a unit's full parameters are."""

    SHARDED = "sharded"
    """Only this rank's shard is held (stage 3, between uses)."""
    GATHERING = "gathering"
    """An all-gather into the full buffer is in flight."""
    GATHERED = "gathered"
    """The full parameters are in the full buffer, usable."""


class GradState(str, Enum):
    """Where a unit's gradients are in one backward."""

    IDLE = "idle"
    """No backward since the last step."""
    ACCUMULATING = "accumulating"
    """Backward runs; some trainable parameters still wait for their gradient."""
    READY = "ready"
    """Every trainable parameter has its gradient for this micro-batch."""
    REDUCING = "reducing"
    """Its reduction is issued (in flight or done) for this micro-batch."""


_PARAM_MOVES: dict[ParamState, set[ParamState]] = {
    ParamState.SHARDED: {ParamState.GATHERING},
    ParamState.GATHERING: {ParamState.GATHERED},
    ParamState.GATHERED: {ParamState.SHARDED},
}
_GRAD_MOVES: dict[GradState, set[GradState]] = {
    GradState.IDLE: {GradState.ACCUMULATING, GradState.IDLE},
    GradState.ACCUMULATING: {GradState.READY, GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE},
    GradState.READY: {GradState.REDUCING, GradState.ACCUMULATING, GradState.IDLE},
    GradState.REDUCING: {GradState.ACCUMULATING, GradState.IDLE},
}


class LifecycleError(RuntimeError):
    """A unit was asked to move between states its lifecycle does not connect: a bug in the runtime."""


@dataclass
class UnitState:
    """Buffers, lifecycle states and per-backward bookkeeping of one unit."""

    index: int
    layout: UnitLayout
    params: list[nn.Parameter]
    full: FlatBuffer
    """The full parameters in the compute dtype (allocated only while GATHERED or GATHERING in stage 3)."""
    master: torch.Tensor
    """The fp32 master values this rank updates (the whole unit in stage 0, its shard above)."""
    grad_shard: torch.Tensor
    """The fp32 gradients the optimizer reads, same range as `master`."""
    shard: torch.Tensor | None = None
    """Stage 3: this rank's shard in the compute dtype, the source of every gather."""
    grad_full: FlatBuffer | None = None
    """Stages 0/1: the flat full gradients autograd accumulates into."""
    resident: bool = True
    """Stays gathered once gathered (stages 0-2; small stage-3 units)."""
    params_state: ParamState = ParamState.GATHERED
    grads_state: GradState = GradState.IDLE
    gather: Pending | None = None
    grads_left: int = 0
    arena: torch.Tensor | None = None
    """Contiguous gradients: the arena slice this unit's `.grad` views point into during its backward."""
    unsharded_bytes: int = 0
    """Bytes of this unit's unsharded gradients counted live in the current backward."""
    accum: torch.Tensor | None = None
    """Stage 1, mixed precision, several micro-batches: the fp32 sum of the full gradients until the step."""

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def trainable_count(self) -> int:
        return sum(1 for p in self.params if p.requires_grad)

    @property
    def has_frozen(self) -> bool:
        return any(not p.requires_grad for p in self.params)

    @property
    def gathered(self) -> bool:
        return self.params_state is ParamState.GATHERED

    def move_params(self, to: ParamState) -> None:
        if to not in _PARAM_MOVES[self.params_state]:
            was = self.params_state.value
            raise LifecycleError(f"unit {self.name!r}: parameters cannot go from {was} to {to.value}")
        self.params_state = to

    def finish_gather(self) -> None:
        """Wait for the unit's all-gather if one is in flight; its parameters are usable afterwards."""
        if self.params_state is ParamState.GATHERING:
            assert self.gather is not None
            self.gather.wait()
            self.gather = None
            self.move_params(ParamState.GATHERED)

    def move_grads(self, to: GradState) -> None:
        if to not in _GRAD_MOVES[self.grads_state]:
            was = self.grads_state.value
            raise LifecycleError(f"unit {self.name!r}: gradients cannot go from {was} to {to.value}")
        self.grads_state = to

    # What each buffer holds, by report category: the memory report sums these (each storage once).

    def parameter_tensors(self) -> list[torch.Tensor]:
        """Parameters held between steps: the shard (stage 3) or the full buffer."""
        return [self.shard if self.shard is not None else self.full.data]

    def gathered_tensors(self) -> list[torch.Tensor]:
        """Stage 3: the full buffer while gathered (a resident unit's too)."""
        return [self.full.data] if self.shard is not None else []

    def gradient_tensors(self) -> list[torch.Tensor | None]:
        """The flat full gradients (stages 0/1), the fp32 shard, and any `.grad` still alive."""
        held: list[torch.Tensor | None] = [self.grad_full.data] if self.grad_full is not None else []
        return [*held, self.grad_shard, *(p.grad for p in self.params)]

    def master_tensors(self) -> list[torch.Tensor]:
        """The fp32 master (the parameters themselves under fp32 compute: then counted there, first)."""
        return [self.master]
