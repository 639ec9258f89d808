"""Compiled units (`zero.compile`): each block unit's forward compiled on its own, as torchtitan compiles blocks.

Only the module's `forward` is compiled, never the module call: the engine's forward pre-hook (stage 3 waits for
the unit's gather there), its forward hook and the gradient hooks run eagerly around the compiled code, so no
collective is ever traced. Activation checkpointing wraps the compiled forward, so its recompute runs the compiled
code too. The root unit (embeddings, head: whatever the model's own forward does between blocks) stays eager.

A unit whose forward cannot be captured as one graph (`fullgraph=True` raises at its first call, before anything
runs) goes on eagerly: one warning per distinct break names the first unit and the break, and the engine's
`eager_units` keeps each unit's reason, so a model that breaks in every unit still trains, only without the speed-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

log = logging.getLogger(__name__)


class CompiledForward:
    """A unit's forward: compiled, or eager after the compiler refused it."""

    def __init__(self, name: str, forward: Callable[..., Any], broken: dict[str, str]) -> None:
        self.name, self.eager, self.broken = name, forward, broken
        self.compiled: Callable[..., Any] = torch.compile(forward, fullgraph=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.name in self.broken or _get_current_dispatch_mode() is not None:
            # A TorchDispatchMode around the call (a tracer or byte counter, as bench/compare/compare.py's) cannot be
            # traced through: that call runs eagerly, the unit stays compiled.
            return self.eager(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as e:
            # Raised while tracing, before the graph ran: running the same call eagerly repeats nothing.
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if reason not in self.broken.values():  # once per break: blocks share their code, and so their breaks
                log.warning(
                    "zero.compile: unit %r (and any other unit that breaks the same way) runs eagerly: its forward "
                    "does not compile to one graph (%s); make that code traceable, or set zero.compile: false",
                    self.name,
                    reason,
                )
            self.broken[self.name] = reason
            return self.eager(*args, **kwargs)


def compile_units(units: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """Compile each unit module's forward in place; returns the map, filled as units fall back, of unit -> why it
    runs eagerly."""
    broken: dict[str, str] = {}
    for name, module in units:
        module.forward = CompiledForward(name, module.forward, broken)
    return broken
