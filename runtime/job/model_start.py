"""The rank's task and where its model's starting values come from.

The entry point is called inside a partitioned construction (`zerotrain.runtime.construction.partitioned`): the
model it returns holds placeholders, and the rank only its slice of each parameter. Where that cannot be done (a
model that reads its own weights while it is built, one built on a GPU, an entry point that keeps parameters
outside the task's model) the rank builds it whole, as before, and says why in one line.

The engine's `ParameterSource` is then the construction's (`materialize.ConstructedValues`), or, for a model built
whole, none: the engine's default takes rank 0's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from zerotrain.errors import UserError
from zerotrain.runtime.construction.materialize import ConstructedValues
from zerotrain.runtime.construction.partitioned import build_partitioned
from zerotrain.runtime.job.task import TrainingTask, check_arguments, check_task, load_entrypoint
from zerotrain.runtime.zero.param_source import ParameterSource


@dataclass
class Start:
    """The rank's task and its model's starting values."""

    task: TrainingTask
    source: ParameterSource | None
    """Where the engine takes the units' values from; None: the model's own (built whole), rank 0's."""
    notes: list[str]
    """What rank 0 says about how the model was built (one line each)."""


def _group() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def start_task(entrypoint: str, *, rank: int, world_size: int, args: dict[str, Any]) -> Start:
    """Import and call the entry point for one rank (as `rank` of `world_size` for its data), its model built
    partitioned over the process group's ranks where it can be."""
    fn = load_entrypoint(entrypoint)
    check_arguments(fn, entrypoint, args)

    def call() -> TrainingTask:
        return check_task(fn(rank=rank, world_size=world_size, **args), entrypoint)

    built = build_partitioned(call, lambda task: task.model, *_group(), passthrough=UserError)
    task: TrainingTask = built.result
    if built.slices is None:
        note = f"model built whole on every rank (its construction cannot be partitioned: {built.whole_because})"
        return Start(task, None, [note])
    return Start(task, ConstructedValues(built.slices, task.model), [])
