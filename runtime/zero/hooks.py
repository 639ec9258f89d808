"""Autograd and module hooks: when a unit's gradients are complete, and (stage 3) when to gather and free.

Gradient completion: a post-accumulate-grad hook on every trainable parameter counts down the unit's
trainable parameters; the last one hands the unit to the engine's reduction schedule while the rest of
backward still runs. Autograd fires AccumulateGrad once per parameter per backward, summed over
all uses, so tied parameters count once. Parameters that got no gradient (unused) are reduced at
the end of backward by the engine, in unit order, so every rank still issues the same collectives.

Stage 3: a forward pre-hook gathers the unit (waiting for its prefetch if one is in flight) and
starts gathering the next `prefetch_units` units of the previous iteration's forward order
asynchronously; a forward hook frees it and hooks its outputs' gradients (`on_output_grad`), so the unit is
gathered again (and the unit backward reaches next prefetched) before any of the unit's backward runs. The
outputs themselves are left as they are, so code may modify them in place. The unit is freed again when its
gradients are complete. A frozen unit has no gradients to tell that: it is freed once backward has computed the
gradients of its module's inputs (`on_input_grad`, as FSDP2's post-backward), after which nothing of that module's
backward is left; where no input needs a gradient (the first block under a frozen embedding), at the end of backward.
A module's trainable unit and its frozen twin are gathered together, and prefetching counts modules, not units. The
root unit (every parameter outside the unit classes: embeddings, the head) stays gathered from forward into
backward, which needs it first: stage 3 moves 3Ψ per step less one gather of the root.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from zerotrain.runtime.zero.grad_arena import GradArenas
from zerotrain.runtime.zero.unit import GradState, ParamState, Unit


class GradReadyHooks:
    """Calls `on_ready(unit)` once per backward when all of a unit's trainable parameters have their gradient."""

    def __init__(self, units: list[Unit], on_ready: Callable[[Unit], None]) -> None:
        self.on_ready = on_ready
        self.handles = []
        for u in units:
            for p in u.params:
                if p.requires_grad:
                    self.handles.append(p.register_post_accumulate_grad_hook(self._hook(u)))

    def _hook(self, u: Unit) -> Callable[[torch.Tensor], None]:
        def fired(_: torch.Tensor) -> None:
            u.grads_left -= 1
            if u.grads_left == 0:
                u.move_grads(GradState.READY)
                self.on_ready(u)

        return fired

    @staticmethod
    def arm(units: list[Unit]) -> None:
        for u in units:
            u.grads_left = u.trainable_count
            u.move_grads(GradState.ACCUMULATING)


class _AfterBackward(torch.autograd.Function):
    """Identity on a module's inputs whose backward runs `hook`: autograd calls it once every gradient the module's
    backward produces for them is in, so nothing of that module's backward is left to run."""

    @staticmethod
    def forward(ctx: Any, hook: Callable[[], None], *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.hook = hook
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.hook()
        return (None, *grads)


def on_input_grad(args: Any, kwargs: Any, hook: Callable[[], None]) -> tuple[Any, Any]:
    """`args` and `kwargs` of a module's call with its grad-requiring tensors passed through `_AfterBackward`, so
    `hook` runs when backward has finished the module (none need a gradient: unchanged, and `hook` never runs)."""
    if not torch.is_grad_enabled():
        return args, kwargs
    leaves, spec = pytree.tree_flatten((args, kwargs))
    at = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not at:
        return args, kwargs
    passed = _AfterBackward.apply(hook, *(leaves[i] for i in at))
    for i, t in zip(at, passed, strict=True):
        leaves[i] = t
    new_args, new_kwargs = pytree.tree_unflatten(leaves, spec)
    return new_args, new_kwargs


def on_output_grad(output: Any, hook: Callable[[], None]) -> None:
    """Run `hook` when backward first reaches any grad-requiring tensor of `output` (any pytree): before the
    module that made it runs its backward. A hook on the tensors, not a wrapper around them, so the caller may go
    on to modify the output in place (`y += block(x)`)."""
    if not torch.is_grad_enabled():
        return
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if leaves:
        torch.autograd.graph.register_multi_grad_hook(leaves, lambda _grads: hook(), mode="any")


def install_unit_hooks(units: list[Unit], arenas: GradArenas | None, on_forward: Callable[[int], None]) -> None:
    """The engine's per-module hooks: `on_forward(index)` before each unit module runs, and with gradient arenas
    the unit's arena bound when backward reaches its output, before its backward."""
    for u in units:
        module = u.layout.module
        if module is None:
            continue
        if arenas is not None and not u.layout.frozen:
            module.register_forward_hook(lambda _m, _i, out, u=u: on_output_grad(out, lambda: arenas.bind(u)))
        module.register_forward_pre_hook(lambda *_, i=u.index: on_forward(i))


class Prefetcher:
    """Stage 3: when each unit is gathered, freed and prefetched, following last iteration's forward order.

    It decides when; the units do the gathering and freeing. Idle (no hooks) when every unit starts gathered,
    as in stages 0-2."""

    def __init__(self, units: list[Unit], prefetch: int) -> None:
        self.units, self.prefetch = units, prefetch
        self.active = any(u.params_state is ParamState.SHARDED for u in units)
        self.prefetches = 0  # gathers issued ahead of need, so they overlap the running unit's compute
        blocks = [u.index for u in units if u.layout.module is not None]
        self.order: list[int] = blocks  # last iteration's forward order; registration order until then
        self.current: list[int] = []
        self.pos = 0  # next position of `order` whose gather this forward has not issued yet
        self.backward_seen: set[int] = set()  # units whose pre-backward ran in this backward

    def prefetch_after(self, order: list[int], pos: int, step: int) -> None:
        """Start gathering the units of the next `prefetch` modules after position `pos` of `order`, walking by
        `step` (a frozen twin beside the unit at `pos` is its own module's, and gathered too)."""
        modules = {id(self.units[order[pos]].layout.module)} if 0 <= pos < len(order) else set()
        budget = len(modules) + self.prefetch
        j = pos + step
        while 0 <= j < len(order):
            unit = self.units[order[j]]
            modules.add(id(unit.layout.module))
            if len(modules) > budget:
                return
            if unit.unshard():
                self.prefetches += 1
            j += step

    def install(self) -> None:
        if not self.active:
            return
        for u in self.units:
            if u.layout.module is not None:
                u.layout.module.register_forward_pre_hook(self._pre_forward(u))
                u.layout.module.register_forward_hook(self._post_forward(u))
                if u.layout.frozen and not u.resident:
                    u.layout.module.register_forward_pre_hook(self._release_after_backward(u), with_kwargs=True)

    @staticmethod
    def _release_after_backward(u: Unit) -> Callable[..., tuple[Any, Any]]:
        def hook(_m: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
            return on_input_grad(args, kwargs, u.reshard)

        return hook

    def _pre_forward(self, u: Unit) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            self.current.append(u.index)
            if u.index in self.order[self.pos :]:
                # Gathers follow the schedule (last iteration's order), not what this rank happens to
                # run: a rank that skips a unit still issues its gather, so ranks stay matched until
                # the end-of-forward check names the divergence instead of gloo mixing up units.
                target = self.order.index(u.index, self.pos)
                for j in range(self.pos, target + 1):
                    self.units[self.order[j]].unshard()
                self.pos = target + 1
            u.gather_now()
            self.prefetch_after(self.order, self.pos - 1, +1)

        return hook

    def _post_forward(self, u: Unit) -> Callable[..., Any]:
        def hook(_m: Any, _i: Any, output: Any) -> Any:
            u.reshard()
            on_output_grad(output, lambda: self.pre_backward(u))
            return output

        return hook

    def pre_backward(self, u: Unit) -> None:
        self.backward_seen.add(u.index)
        u.gather_now()
        if u.index in self.order:
            self.prefetch_after(self.order, self.order.index(u.index), -1)
        else:  # the root: backward reaches the last forward unit first
            self.prefetch_after(self.order, len(self.order), -1)

    def replay_pre_backward(self, index: int) -> None:
        """A unit backward never reached is reduced at its end: gather it as its pre-backward would have."""
        if self.active and index not in self.backward_seen:
            self.pre_backward(self.units[index])

    def begin_forward(self, roots: list[Unit]) -> None:
        if not self.active:
            return
        self.current, self.pos = [], 0
        for root in roots:
            root.gather_now()
        self.prefetch_after(self.order, -1, +1)

    def end_forward(self, roots: list[Unit], output: Any) -> Any:
        if not self.active:
            return output
        if self.current:
            self.order = self.current
        for u in self.units:
            # Including units scheduled (so gathered) but not run. The root stays gathered into backward, which
            # needs it first (the head): freeing it here would cost one more gather of it every step.
            if not any(u is root for root in roots) or not torch.is_grad_enabled():
                u.reshard()
        for root in roots:
            on_output_grad(output, functools.partial(self.pre_backward, root))
        return output

    def begin_backward(self) -> None:
        self.backward_seen = set()
