"""The engine's training state as one value: what a checkpoint saves and what a load restores.

`ZeroEngine.state_dict()` returns an `EngineState`: this rank's shards (fp32 masters, optimizer state, the model's
persistent buffers), where training stands, the loss scaler, and a `ShardLayout` saying where the shards sit in the
whole model. Checkpoints read and write an engine through that alone (`Checkpointable`), as torchtitan's
checkpointer reads its `Stateful` components, and load the way torch.distributed.checkpoint does: take
`state_dict()`, fill its tensors in place, hand it to `load_state_dict()`. The masters are views of the engine's own
buffers, so a load that fills them in place holds no second copy of the model.

`load_state_dict` takes a state of this engine's own layout; a state saved at another world size, stage or
alignment reaches the engine through `checkpoint.load`, which reads each rank's ranges out of the saved files (and
hands the optimizer state it read, rather than filling `state_dict()`'s, which holds none before the first step).
As `torch.optim.Optimizer.load_state_dict` does, a load takes the optimizer state's tensors as they are, not copies:
a state loaded into one engine is that engine's from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from zerotrain.runtime.zero.buffers import BufferSlot, ModelBuffers
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.partition import ParamSlot
from zerotrain.zero_config import Precision, Stage, ZeroConfig

if TYPE_CHECKING:
    from zerotrain.runtime.zero.unit import Unit


@dataclass(frozen=True)
class UnitShard:
    """One unit of the layout: its parameters' places and this rank's part of its fp32 master."""

    name: str
    """The unit's name (its module's path in the model; the root unit holds what no unit module claims)."""
    numel: int
    """Parameter elements of the unit."""
    extent: int
    """Elements up to the end of its last parameter: `numel` plus the alignment gaps between parameters."""
    params: tuple[ParamSlot, ...]
    """Each parameter's name, shape, offset in the unit's flat buffer and optimizer class."""
    master_range: tuple[int, int]
    """`[start, stop)` in unit coordinates of the fp32 master this rank holds (stops clipped at nothing: padding
    past `extent` is zeros)."""


@dataclass(frozen=True)
class ShardLayout:
    """Where this rank's shards sit in the whole model: what a loader at another world size or stage maps from."""

    rank: int
    """This rank in the job."""
    world_size: int
    """Ranks in the job."""
    shard_group_size: int
    """Ranks a model state is sharded over (the world size, or a hybrid shard group's size)."""
    replica: int
    """This rank's shard group; only group 0 saves the model states, the others hold the same bytes."""
    stage: Stage
    """The ZeRO stage the engine runs."""
    precision: Precision
    """The compute precision."""
    units: tuple[UnitShard, ...]
    """The units, in the engine's order."""
    optimizer_segments: tuple[tuple[int, int, int], ...]
    """(unit, start, stop) in unit coordinates of each optimizer parameter, in the optimizer's own order (unit -1:
    a parameter that is not a master shard)."""
    buffers: tuple[BufferSlot, ...]
    """The model's persistent buffers: name, shape, dtype."""
    broadcast_buffers: bool
    """zero.broadcastBuffers: every rank keeps rank 0's buffers (else each keeps its own)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Tied parameters: every extra name of a parameter -> the name it is saved under."""

    @property
    def holds_model_states(self) -> bool:
        """This rank's file carries masters and optimizer state (hybrid sharding: only the first group's do)."""
        return self.replica == 0

    @property
    def saves_buffers(self) -> bool:
        """This rank's file carries the model's buffers: rank 0's always, every rank's when each keeps its own."""
        return self.rank == 0 or not self.broadcast_buffers

    def model_record(self) -> list[dict[str, Any]]:
        """Units with their parameters' names, shapes, offsets and optimizer classes, as a checkpoint's marker
        records them: what a checkpoint must match to load (the class lets an export rebuild weight-decay groups)."""
        return [
            {
                "unit": u.name,
                "numel": u.numel,
                "params": [[s.name, list(s.shape), s.offset, int(s.kind)] for s in u.params],
            }
            for u in self.units
        ]

    def buffer_record(self) -> list[list[Any]]:
        """The persistent buffers as the marker records them: [name, shape, dtype]."""
        return [[b.name, list(b.shape), str(b.dtype).removeprefix("torch.")] for b in self.buffers]

    def shard_difference(self, other: ShardLayout) -> str | None:
        """The first way `other` shards the model differently from this layout, in words; None when alike."""
        if [u.name for u in other.units] != [u.name for u in self.units]:
            return f"units {[u.name for u in other.units]}, not this engine's {[u.name for u in self.units]}"
        for mine, theirs in zip(self.units, other.units, strict=True):
            if (theirs.params, theirs.master_range) != (mine.params, mine.master_range):
                return f"unit {mine.name!r} holds {theirs.master_range}, not this rank's {mine.master_range}"
        if other.optimizer_segments != self.optimizer_segments:
            return "its optimizer parameters cover other ranges than this engine's"
        return None


@dataclass(frozen=True)
class Position:
    """Where training stands: the counters a resumed run continues from."""

    steps: int
    """Optimizer steps applied (fp16 steps skipped for overflow are not counted)."""
    micro_steps: int
    """Micro-batches consumed, skipped steps' included: data is skipped by micro-batches, never by updates."""
    accumulation: int = 1
    """Micro-batches per step (zero.gradientAccumulationSteps)."""
    samples_per_micro_batch: int = 0
    """Global samples in one micro-batch over all ranks (0 when the task does not say)."""

    def record(self) -> dict[str, int]:
        """The position as a checkpoint records it: micro-batches, steps attempted and applied, samples."""
        return {
            "micro_batches": self.micro_steps,
            "step": self.micro_steps // self.accumulation,
            "optimizer_steps": self.steps,
            "samples": self.micro_steps * self.samples_per_micro_batch,
        }


@dataclass
class EngineState:
    """One rank's training state. Its tensors are the engine's own (views, not copies): copy them before the next
    step when they must outlive it, and fill them in place to load."""

    layout: ShardLayout
    """Where the shards sit."""
    masters: list[torch.Tensor]
    """Each unit's fp32 master shard, in the layout's unit order (`[start, stop)` of its `master_range`)."""
    optimizer: dict[str, Any]
    """The wrapped optimizer's own `state_dict()` over this rank's shards."""
    buffers: dict[str, torch.Tensor] | None
    """The model's persistent buffers by name; None leaves the engine's as they are on load."""
    position: Position
    """The step counters."""
    scaler: dict[str, Any]
    """The loss scaler's state (scale, skipped steps, growth counter)."""


def load_problem(mine: ShardLayout, masters: list[torch.Tensor], groups: list[int], state: EngineState) -> str | None:
    """Why `state` cannot load into an engine of layout `mine` (its masters, its optimizer's parameters per group),
    in words; None when it can. Checked before anything is written, so a refused load changes nothing."""
    difference = mine.shard_difference(state.layout)
    if difference is not None:
        return f"it shards {difference}"
    for unit, held, given in zip(mine.units, masters, state.masters, strict=True):
        if given.shape != held.shape:
            return f"unit {unit.name!r}'s master shard is {list(given.shape)}, not {list(held.shape)}"
    saved = [len(g["params"]) for g in state.optimizer.get("param_groups", [])]
    if saved != groups:
        return f"its optimizer has parameter groups of {saved} parameters, this engine's {groups}"
    known = {b.name: b.shape for b in mine.buffers}
    for name, value in (state.buffers or {}).items():
        if name not in known:
            return f"buffer {name!r} is not one of this model's"
        if tuple(value.shape) != tuple(known[name]):
            return f"buffer {name!r} is {list(value.shape)}, not {list(known[name])}"
    return None


def tied_names(module: nn.Module, saved: set[str]) -> dict[str, str]:
    """Tied parameters: every name of a parameter other than the one in `saved` -> the name it is saved under."""
    owner = {id(p): n for n, p in module.named_parameters()}
    return {n: owner[id(p)] for n, p in module.named_parameters(remove_duplicate=False) if n not in saved}


class Checkpointable(Protocol):
    """What a checkpoint needs of an engine: its state, and the collectives and device its ranks agree through."""

    @property
    def comm(self) -> Comm:
        """The job's collectives (a checkpoint's token, digests and verdicts go through them)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the collectives' tensors live."""
        ...

    @property
    def layout(self) -> ShardLayout:
        """Where this rank's shards sit (the same as `state_dict().layout`, without taking the state)."""
        ...

    def state_dict(self) -> EngineState: ...

    def load_state_dict(self, state: EngineState) -> None: ...


@dataclass
class StepResult:
    """What one `step()` call did."""

    applied: bool
    """The optimizer stepped (False between accumulation boundaries and on fp16 overflow)."""
    grad_norm: float | None = None
    """Global gradient norm over all shards before clipping; computed only when clipping, fp16 loss scaling or
    `report_grad_norm` needs it (None otherwise and between boundaries)."""
    overflow: bool = False
    """fp16 gradients overflowed; the step was skipped and the loss scale lowered."""
    loss_scale: float = 1.0
    """Loss scale used for this step's gradients."""
    loss: float | None = None
    """The loss of this step's micro-batches averaged over them and over ranks, or for summed losses the mean over
    every counted token (None between boundaries)."""
    votes: int = 0
    """How many ranks passed `vote=True` to this step."""
    written: int = 0
    """How many ranks passed `written=True` (their checkpoint write in flight is on disk)."""


def shard_layout(
    units: list[Unit],
    where: tuple[int, int, int, int],
    config: ZeroConfig,
    optimizer_segments: list[tuple[int, int, int]],
    buffers: ModelBuffers,
    module: nn.Module,
) -> ShardLayout:
    """The engine's layout: `where` is (rank, world size, shard group size, replica)."""
    rank, world_size, shard_ranks, replica = where
    shards = tuple(
        UnitShard(u.name, u.layout.numel, u.layout.extent, tuple(u.layout.slots), u.master_range) for u in units
    )
    saved = {s.name for u in units for s in u.layout.slots}
    return ShardLayout(
        rank=rank,
        world_size=world_size,
        shard_group_size=shard_ranks,
        replica=replica,
        stage=config.fixed_stage,
        precision=config.precision,
        units=shards,
        optimizer_segments=tuple(optimizer_segments),
        buffers=tuple(buffers.slots),
        broadcast_buffers=buffers.broadcast,
        aliases=tied_names(module, saved),
    )


def full_values(units: list[Unit], module: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded fp32 parameters by name, tied parameters under every name (a collective on every rank when the
    optimizer state is sharded)."""
    out: dict[str, torch.Tensor] = {}
    for u in units:
        full = u.full_master()
        for s in u.layout.slots:
            out[s.name] = full[s.offset : s.offset + s.numel].view(s.shape).clone()
    for name, p in module.named_parameters(remove_duplicate=False):
        if name not in out:
            owner = next(n for n, q in module.named_parameters() if q is p)
            out[name] = out[owner]
    return out
