"""Build the entry point's model partitioned: no rank ever holds more of it than one module at a time.

`partitioned(rank, world_size)` is a context for the call of the entry point. While it is open:

- a global module-registration hook takes every module's own parameters as soon as the module is registered in its
  parent (its constructor, and with it its own init, has finished): each becomes a placeholder, the rank keeping its
  slice (`placeholders`);
- a function mode records init code that later writes into placeholders, and refuses code that reads them
  (`deferred`).

`finish(model)` then takes the parameters no parent registration covered (the root's own, any re-assigned ones),
forgets what the model no longer holds, and checks that nothing read a placeholder into the model or keeps one
outside it. What it returns is the engine's source (`materialize.ConstructedValues`).

Whatever makes a construction impossible to partition raises `CannotPartition`; `build_partitioned` then builds
the model whole, as before, after restoring every random generator, and says why.
"""

from __future__ import annotations

import gc
import random
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from zerotrain.runtime.construction.deferred import Recorder, init_functions_recorded
from zerotrain.runtime.construction.placeholders import CannotPartition, Slices


@contextmanager
def partitioned(rank: int, world_size: int) -> Iterator[Slices]:
    """Hand every registered module's parameters over to placeholders while the block runs (see the module)."""
    slices = Slices(rank, world_size)

    def registered(parent: nn.Module, name: str, child: nn.Module | None) -> None:
        if child is None:
            return
        with torch._C.DisableTorchFunction():  # our own look at the parameters is not the model's
            for pname, param in list(child._parameters.items()):
                if param is not None:
                    slices.take(param, f"{type(child).__name__}.{pname}")

    handle = register_module_module_registration_hook(registered)
    recorder = Recorder(slices)
    try:
        with recorder, init_functions_recorded(recorder):
            yield slices
    finally:
        handle.remove()


def finish(slices: Slices, model: nn.Module) -> None:
    """The model is built: take what is still whole, drop what it no longer holds, and check it is all accounted
    for (CannotPartition otherwise)."""
    for name, param in model.named_parameters():
        slices.take(param, name)
    held = {id(p) for p in model.parameters()}
    orphans = [weakref.ref(h.param) for h in slices.by_storage.values() if id(h.param) not in held]
    slices.keep_only(held)
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise CannotPartition(f"buffer {name} was computed from the parameters while the model was built")
    gc.collect()
    kept = [p for p in (r() for r in orphans) if p is not None]
    if kept:
        raise CannotPartition(
            f"the entry point keeps a parameter outside its TrainingTask.model ({', '.join(_where(p) for p in kept)})"
        )


def _where(param: nn.Parameter) -> str:
    return f"{tuple(param.shape)} {str(param.dtype).removeprefix('torch.')}"


@dataclass
class RandomState:
    """Every generator an entry point may draw from, to build again from the same point."""

    torch_cpu: torch.Tensor
    python: Any
    numpy: Any

    @classmethod
    def now(cls) -> RandomState:
        np = sys.modules.get("numpy")
        return cls(torch.get_rng_state(), random.getstate(), np.random.get_state() if np is not None else None)

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        random.setstate(self.python)
        np = sys.modules.get("numpy")
        if np is not None and self.numpy is not None:
            np.random.set_state(self.numpy)


@dataclass
class Built:
    """An entry point's result, and how its model was built."""

    result: Any
    slices: Slices | None
    """The partitioned model's slices; None when it was built whole."""
    whole_because: str | None = None
    """Why the model was built whole (the partitioned attempt's reason)."""


def build_partitioned(
    call: Callable[[], Any],
    model_of: Callable[[Any], nn.Module],
    rank: int,
    world_size: int,
    passthrough: type[Exception],
) -> Built:
    """Run the entry point partitioned; if that cannot be done, run it again the ordinary way from the same random
    state and say why. Exceptions of type `passthrough` (the user's own configuration errors) are raised at once."""
    start = RandomState.now()
    try:
        with partitioned(rank, world_size) as slices:
            result = call()
        finish(slices, model_of(result))
        return Built(result, slices)
    except passthrough:
        raise
    except Exception as e:  # whatever the partitioned attempt broke: the ordinary build decides
        reason = str(e) if isinstance(e, CannotPartition) else f"{type(e).__name__}: {str(e).splitlines()[0]}"
    start.restore()
    gc.collect()  # the attempt's placeholders and slices go before the whole model is built
    return Built(call(), None, reason)
