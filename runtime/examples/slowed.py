"""The quickstart's GPT with one rank made slow on purpose: the entry point that tests (and you) use to see a
straggler named.

    entrypoint: zerotrain.runtime.examples.slowed:build
    entrypointArgs: {slow_rank: 1, cause: input, factor: 1.5, data_seconds: 0.03, ...the GPT's own arguments}

Every rank's batches take `data_seconds` to arrive (a stand-in for a loader reading from storage); on `slow_rank`
they take `factor` times as long (`cause: input`), or its blocks' forward and backward take `factor` times as long
as they would (`cause: compute`: after each, a sleep of (factor − 1) times what it took). `factor: 1` slows
nothing: the healthy run to compare with.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from torch import nn

from zerotrain.runtime.examples import gpt
from zerotrain.runtime.job.task import ConfigError, TrainingTask

CAUSES = ("input", "compute")


def _paced(batches: Iterator[Any], seconds: float) -> Iterator[Any]:
    for batch in batches:
        time.sleep(seconds)
        yield batch


def _slow_compute(model: nn.Module, factor: float) -> None:
    """Each block's forward and backward made `factor` times as long: after each, a sleep of (factor − 1) times what
    it took (the blocks are nearly all of the model's compute)."""
    for block in (m for m in model.modules() if isinstance(m, gpt.Block)):
        forward: list[float] = []
        backward: list[float] = []
        block.register_forward_pre_hook(lambda *_, t=forward: t.append(time.perf_counter()))
        block.register_forward_hook(lambda *_, t=forward: _sleep_since(t, factor))
        block.register_full_backward_pre_hook(lambda *_, t=backward: t.append(time.perf_counter()))
        block.register_full_backward_hook(lambda *_, t=backward: _sleep_since(t, factor))


def _sleep_since(started: list[float], factor: float) -> None:
    time.sleep((factor - 1.0) * (time.perf_counter() - started.pop()))


def build(
    rank: int,
    world_size: int,
    *,
    slow_rank: int = 1,
    cause: str = "input",
    factor: float = 1.5,
    data_seconds: float = 0.03,
    **gpt_args: Any,
) -> TrainingTask:
    """The GPT task of `gpt.build(**gpt_args)`, its batches paced at `data_seconds`, rank `slow_rank` slowed."""
    if cause not in CAUSES:
        raise ConfigError(f"spec.entrypointArgs.cause: got {cause!r}; use one of {', '.join(CAUSES)}")
    if not 1.0 <= factor <= 100.0:
        raise ConfigError(f"spec.entrypointArgs.factor: got {factor}; use a factor from 1 (no slowdown) to 100")
    if data_seconds < 0:
        raise ConfigError(f"spec.entrypointArgs.data_seconds: got {data_seconds}; use 0 or more seconds")
    task = gpt.build(rank, world_size, **gpt_args)
    slowed = rank == slow_rank
    pace = data_seconds * (factor if slowed and cause == "input" else 1.0)
    if pace > 0:
        task.batches = _paced(task.batches, pace)
    if slowed and cause == "compute" and factor > 1.0:
        _slow_compute(task.model, factor)
    return task
