"""Init code that runs over parameters already handed over (a whole-model init pass), recorded to run again.

While the entry point runs, a `TorchFunctionMode` sees every torch call that touches a placeholder:

- A view or a question about its shape, dtype or device runs on the meta tensor (it needs no values).
- An in-place write into it (`torch.nn.init.*_`, `Tensor.normal_`, `zero_`, `copy_`, `__setitem__`, `+=`) is
  recorded with the view it wrote into and the CPU generator's state, then run once on a scratch tensor of the
  parameter's size so that the generator advances exactly as it would have: everything drawn afterwards (the next
  module's init, the data order) is what an ordinary construction draws. Replayed on the real values with that state
  restored (`replay`), each write produces the very values it would have: the parameters are bit-identical to an
  ordinary construction's with the same seed.
- `param.data = tensor` gives the parameter new values outright (`Slices.reset`).
- Anything else that involves a placeholder computes from its values: the construction cannot be partitioned, and
  `CannotPartition` says which parameter was read and by what. So does asking whether a placeholder `is_meta`
  (init code that skips meta tensors would silently do nothing), and writing into one through `out=`.

Some of `torch.nn.init`'s functions reach no torch call a mode sees before they skip a meta tensor
(`trunc_normal_`, a rejection sampler whose draws depend on its own values) or write through `out=` (`eye_`):
while the construction runs, `init_functions_recorded` routes them, whole, into the recorder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.init as nn_init
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from zerotrain.runtime.construction.placeholders import CannotPartition, Deferred, Geometry, Held, Slices

_NOT_WRITES = {"requires_grad_", "retain_grad", "share_memory_", "pin_memory"}
_INPLACE_DUNDERS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or")}
_DATA = torch._C.TensorBase.data  # the `param.data` descriptor
_IS_META = torch._C.TensorBase.is_meta
_UNSEEN_INIT = (
    "dirac_",
    "eye_",
    "kaiming_normal_",
    "ones_",
    "orthogonal_",
    "sparse_",
    "trunc_normal_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
)
"""torch.nn.init's functions that do not dispatch through a TorchFunctionMode themselves."""


def _name(func: Any) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)


def writes_first_argument(func: Any) -> bool:
    """An in-place operation on its first argument: torch's trailing-underscore convention, item assignment and the
    augmented operators."""
    name = getattr(func, "__name__", "")
    if name in _NOT_WRITES:
        return False
    return name == "__setitem__" or name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))


def _is_data_set(func: Any) -> bool:
    return getattr(func, "__name__", "") == "__set__" and getattr(func, "__self__", None) is _DATA


def _is_meta_query(func: Any) -> bool:
    return getattr(func, "__name__", "") == "__get__" and getattr(func, "__self__", None) is _IS_META


class Recorder(TorchFunctionMode):
    """Records writes into placeholders and refuses reads of them (see the module docstring)."""

    def __init__(self, slices: Slices) -> None:
        super().__init__()
        self.slices = slices

    def _placeholders(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Held]:
        return [h for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and (h := self.slices.held(t))]

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        touched = self._placeholders(args, kwargs)
        if not touched:
            return func(*args, **kwargs)
        if not args and "tensor" in kwargs:  # torch.nn.init's functions pass their target by keyword
            kwargs = dict(kwargs)
            args = (kwargs.pop("tensor"),)
        if _is_meta_query(func):
            raise CannotPartition(f"init code asks whether {touched[0].where} is a meta tensor (to skip it)")
        if isinstance(kwargs.get("out"), torch.Tensor) and self.slices.held(kwargs["out"]) is not None:
            raise CannotPartition(f"{_name(func)} writes into {touched[0].where} through out=")
        if _is_data_set(func):
            target, value = args
            held = self.slices.held(target)
            if held is None or self.slices.held(value) is not None:
                raise CannotPartition(f"{touched[0].where}.data is set from another parameter")
            self.slices.reset(held, value)
            return None
        if writes_first_argument(func) and args and isinstance(args[0], torch.Tensor):
            return self.write(func, args, kwargs, touched)
        out = func(*args, **kwargs)  # on meta tensors: a view, metadata, or a computation without values
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_meta and self.slices.held(t) is None:
                raise CannotPartition(f"{touched[0].where} is read while the model is built ({_name(func)})")
        return out

    def write(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], touched: list[Held]) -> Any:
        """Record `func(placeholder, *rest)`, an in-place write, and draw its randomness on scratch memory."""
        target, rest = args[0], args[1:]
        held = self.slices.held(target)
        if held is None or self._placeholders(rest, kwargs):
            source = touched[-1] if held is not None else touched[0]
            raise CannotPartition(f"{source.where} is read while the model is built ({_name(func)})")
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in tree_leaves((rest, kwargs))):
            raise CannotPartition(f"{held.where} is written from a meta tensor ({_name(func)})")
        generators = [g for g in tree_leaves((rest, kwargs)) if isinstance(g, torch.Generator)]
        op = Deferred(
            func,
            Geometry.of(target),
            rest,
            kwargs,
            torch.get_rng_state(),
            [(g, g.get_state()) for g in generators],
        )
        # Run it on scratch memory of the parameter's size: the generators advance as an ordinary build's would.
        scratch = torch.empty_strided(held.size, held.stride, dtype=held.dtype)
        with torch.no_grad(), torch._C.DisableTorchFunction():
            func(_view(scratch, op.target), *rest, **kwargs)
        held.deferred.append(op)
        return target


def _view(base: torch.Tensor, g: Geometry) -> torch.Tensor:
    return base.as_strided(g.size, g.stride, g.offset)


def replay(held: Held, values: torch.Tensor) -> None:
    """Run a parameter's recorded writes, in order, on `values` (its real tensor, as constructed), each with the
    generator states it ran with; the generators are left as they were."""
    if not held.deferred:
        return
    before = torch.get_rng_state()
    states = {id(g): (g, g.get_state()) for op in held.deferred for g, _ in op.generators}
    try:
        with torch.no_grad():
            for op in held.deferred:
                torch.set_rng_state(op.rng)
                for g, state in op.generators:
                    g.set_state(state)
                op.func(_view(values, op.target), *op.args, **op.kwargs)
    finally:
        torch.set_rng_state(before)
        for g, state in states.values():
            g.set_state(state)


_ACTIVE: list[Recorder] = []
"""The construction under way. The routed init functions look it up when called, not when made: a library imported
during one construction keeps them (transformers holds torch.nn.init's functions in a table of its own), and a
later construction in the process must record into its own recorder, an ordinary call outside one into nothing."""


def _routed(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE:
            recorder = _ACTIVE[-1]
            with torch._C.DisableTorchFunction():  # the recorder's own look, not the model's
                held = recorder.slices.held(tensor)
                if held is not None:
                    return recorder.write(original, (tensor, *args), kwargs, [held])
        return original(tensor, *args, **kwargs)

    return call


@contextmanager
def init_functions_recorded(recorder: Recorder) -> Iterator[None]:
    """While open, torch.nn.init's functions that a mode cannot see (`_UNSEEN_INIT`) record a call on a
    placeholder whole, as the mode records the others; `trunc_normal_` captured under another name (Hugging Face
    keeps the originals) still reaches its helper, which is patched too. Anything else reaching `is_meta` refuses."""
    originals = {name: getattr(nn_init, name) for name in (*_UNSEEN_INIT, "_no_grad_trunc_normal_")}
    _ACTIVE.append(recorder)
    try:
        for name, original in originals.items():
            setattr(nn_init, name, _routed(original))
        yield
    finally:
        _ACTIVE.remove(recorder)
        for name, original in originals.items():
            setattr(nn_init, name, original)
