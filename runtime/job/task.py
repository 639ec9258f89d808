"""The entry-point contract: what a job's `spec.entrypoint` (`package.module:function`) must provide.

Every rank imports the module and calls

    function(rank=RANK, world_size=WORLD_SIZE, **spec.entrypointArgs) -> TrainingTask

after `torch.manual_seed(spec.training.seed)`, so a model built inside is initialised identically on every
rank. The function builds the model (on CPU; the runtime moves it), says how to compute the loss, and returns
an iterator over *this rank's* micro-batches. Data must be split so that the global batch of a step does not
depend on the world size: rank r takes its slice of each global micro-batch (see `zerotrain.runtime.job.data`).

A script entry point (`path/to/train.py` with `spec.args`) is not called this way: the launcher runs the
script itself as every rank, with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from zerotrain.errors import ConfigError
from zerotrain.pod_contract import ENTRYPOINT_PATH_ENV


def _as_is(batch: Any) -> Any:
    return batch


@dataclass(frozen=True)
class LossSum:
    """A micro-batch's loss as a sum over the items it counts (the tokens whose label is not ignored), with their
    number. The runtime divides the summed losses of every rank and every accumulated micro-batch by their summed
    counts, so the step's loss and gradient are those of the mean over every counted item of the global batch: one
    process's, however unevenly the items fall on ranks and micro-batches (answer-only labels). A mean per
    micro-batch averaged over ranks is that only when every micro-batch counts as many."""

    total: torch.Tensor
    """The summed loss (a scalar tensor that backward runs through)."""
    count: torch.Tensor | int
    """How many items `total` sums over (0: none; the micro-batch then adds nothing)."""


@dataclass
class TrainingTask:
    """What an entry point returns for one rank."""

    model: nn.Module
    """The model, built as usual: the runtime builds it partitioned (each rank keeping only its slice of every
    parameter as the modules are registered), with the same values an ordinary build from the seed gives."""
    loss: Callable[[Any, Any], torch.Tensor | LossSum]
    """`loss(model_output, batch)`: the scalar mean loss of one micro-batch, or a `LossSum` (the summed loss and the
    count it sums over) when micro-batches count different numbers of items, so the runtime weighs every item
    alike across ranks and accumulation."""
    batches: Iterator[Any]
    """This rank's micro-batches, in order; one optimizer step consumes gradientAccumulationSteps of them."""
    inputs: Callable[[Any], Any] = _as_is
    """Maps a batch to the model's input: a tuple is passed as positional arguments, a dict as keyword arguments,
    anything else as one argument."""
    tokens_per_batch: int = 0
    """Tokens in one of this rank's micro-batches, for throughput; 0 if not meaningful."""
    samples_per_batch: int = 0
    """Samples (rows) in one of this rank's micro-batches, for the data position checkpoints record; 0 if unknown."""
    unit_modules: list[str] = field(default_factory=list)
    """Module class names forming ZeRO units when `spec.zero.unitModules` is empty (e.g. ["Block"])."""
    eval_batches: Callable[[], Iterator[Any]] | None = None
    """A fresh iterator over this rank's evaluation micro-batches on every call (the same batches each time, split
    across ranks like `batches`); `spec.training.evaluation` runs the first `batches` of them. None: the task has no
    evaluation data, and a manifest asking for evaluation is refused."""


def call_model(model: Callable[..., Any], inputs: Any) -> Any:
    """The model's output for `TrainingTask.inputs(batch)`: a tuple as positional arguments, a dict as keyword
    arguments, anything else as one argument."""
    if isinstance(inputs, tuple):
        return model(*inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


def is_script(entrypoint: str) -> bool:
    """A `.py` path the launcher runs as a script, rather than a `module:function` it calls."""
    return entrypoint.endswith(".py")


def entrypoint_dirs() -> list[str]:
    """Where entry-point modules are found beyond the Python path: the directory of the manifest `zerotrain run`
    was given."""
    return [d for d in os.environ.get(ENTRYPOINT_PATH_ENV, "").split(os.pathsep) if d]


def add_entrypoint_dirs() -> None:
    """Append the working directory, then the manifest's directory, to sys.path: appended, never prepended, so a
    folder there cannot shadow an installed module (this repository's operator/ would shadow the standard
    library's)."""
    for d in [os.getcwd(), *entrypoint_dirs()]:
        if d not in sys.path:
            sys.path.append(d)


def load_entrypoint(entrypoint: str) -> Callable[..., Any]:
    """Import `package.module:function`; ConfigError (naming spec.entrypoint) when it cannot be found."""
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"spec.entrypoint: got {entrypoint!r}; expected `package.module:function` (or a script path ending in .py)"
        )
    add_entrypoint_dirs()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        beside = "".join(f", {d}" for d in entrypoint_dirs())
        raise ConfigError(
            f"spec.entrypoint: got {entrypoint!r}, but module {e.name!r} cannot be imported (looked on the Python "
            f"path, in the working directory{beside}); install it in the image, put it beside the manifest or "
            "on PYTHONPATH, or fix the module path"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"spec.entrypoint: got {entrypoint!r}, but module {module_name!r} has no attribute {attr!r}; "
            f"use one of its functions: {', '.join(public) or '(none)'}"
        )
    if not callable(fn):
        raise ConfigError(f"spec.entrypoint: got {entrypoint!r}, but {attr!r} is not callable; name a function")
    return fn


def check_arguments(fn: Callable[..., Any], entrypoint: str, args: dict[str, Any]) -> None:
    """Fail before any work if `fn(rank=, world_size=, **args)` would not bind."""
    try:
        inspect.signature(fn).bind(rank=0, world_size=1, **args)
    except TypeError as e:
        raise ConfigError(
            f"spec.entrypointArgs: got {args!r}, but {entrypoint} does not accept them ({e}); "
            f"pass only keyword arguments its signature {inspect.signature(fn)} takes"
        ) from None
    except ValueError:  # no signature (a builtin): calling it will tell
        return


def check_task(task: object, entrypoint: str) -> TrainingTask:
    """The entry point's result, refused unless it is a TrainingTask whose model has parameters."""
    if not isinstance(task, TrainingTask):
        raise ConfigError(
            f"spec.entrypoint: {entrypoint} returned {type(task).__name__}, not a TrainingTask; "
            "return zerotrain.runtime.job.task.TrainingTask(model=..., loss=..., batches=...)"
        )
    if not any(True for _ in task.model.parameters()):
        raise ConfigError(f"spec.entrypoint: {entrypoint} returned a model with no parameters; nothing to train")
    return task


def build_task(entrypoint: str, *, rank: int, world_size: int, args: dict[str, Any]) -> TrainingTask:
    """Import and call the entry point for one rank, its model built whole; check it returned a TrainingTask."""
    fn = load_entrypoint(entrypoint)
    check_arguments(fn, entrypoint, args)
    return check_task(fn(rank=rank, world_size=world_size, **args), entrypoint)


PARAMETER_COUNT_TOLERANCE = 0.01
"""How far `spec.model.parameters` may be from the model's count: a rounded figure ("7e9" for 7.06B) plans the
same; a figure for another model would make every memory plan of the job wrong."""


def check_declared_parameters(model: nn.Module, declared: int | None, added: Collection[str] = ()) -> None:
    """Refuse a manifest whose `spec.model.parameters` (what admission planned with) is not this model's Ψ: the
    model's own parameters, those the runtime `added` (LoRA's adapters) left out."""
    if declared is None:
        return
    count = sum(p.numel() for n, p in model.named_parameters() if n not in added)  # each tied parameter once
    if abs(declared - count) > PARAMETER_COUNT_TOLERANCE * count:
        raise ConfigError(
            f"spec.model.parameters: got {declared:,}, but the entry point's model has {count:,} parameters (the "
            f"memory plan was made for the wrong model); set spec.model.parameters: {count}"
        )
