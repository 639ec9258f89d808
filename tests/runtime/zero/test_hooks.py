"""When the hooks fire (`hooks`): a unit is reported ready once per backward when its last trainable gradient is in;
`on_input_grad` runs after a module's backward and `on_output_grad` before it; stage 3's `Prefetcher` gathers each
unit for its forward and backward with the next one prefetched in last iteration's order, and frees it after."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zerotrain.runtime.zero.buckets import BucketPool
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.hooks import GradReadyHooks, Prefetcher, on_input_grad, on_output_grad
from zerotrain.runtime.zero.param_source import ModelValues
from zerotrain.runtime.zero.partition import build_units
from zerotrain.runtime.zero.unit import GradState, ParamState, Unit
from zerotrain.runtime.zero.unit_build import build_unit, kept_range
from zerotrain.runtime.zero.unit_context import Dtypes, ShardPolicy, UnitContext
from zerotrain.zero_config import Stage

G, F = ParamState.GATHERED, ParamState.GATHERING
Seen = list[dict[int, ParamState]]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.spare = nn.Parameter(torch.zeros(4))
        self.use_spare, self.twice = True, False
        self.probe: Callable[[str], None] | None = None  # told when this block's own forward and backward run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.probe is not None:
            self.probe("forward")
        h = self.lin(x) + self.spare if self.use_spare else self.lin(x)
        if self.twice:
            h = self.lin(torch.tanh(h))
        if self.probe is not None and h.requires_grad:
            h.register_hook(lambda _g, probe=self.probe: probe("backward"))
        return torch.tanh(h)


class Net(nn.Module):
    """Units 0-2 are the blocks, unit 3 the root (the head)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = [Block() for _ in range(3)]  # the blocks, typed
        self.blocks = nn.ModuleList(self.parts)
        self.head = nn.Linear(4, 1)
        self.order = [0, 1, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.order:
            x = self.blocks[i](x)
        return self.head(x)


def units_of(model: nn.Module, stage: Stage) -> list[Unit]:
    """World-size-1 units (no process group: `Comm` copies instead of launching collectives)."""
    comm = Comm(timeout_seconds=60)
    ctx = UnitContext(comm, Dtypes(torch.float32, torch.float32), ShardPolicy.of(stage), BucketPool(comm), 64, 64)
    named, units = dict(model.named_parameters()), list[Unit]()
    for i, la in enumerate(build_units(model, ["Block"], [], world_size=1)):
        lo, hi = kept_range(ctx, la)
        values = torch.empty(hi - lo)
        ModelValues(model).fill(la, lo, hi, values, comm)
        units.append(build_unit(ctx, i, la, [named[s.name] for s in la.slots], values, persist=0))
    return units


def held(prefetcher: Prefetcher) -> dict[int, ParamState]:
    """The prefetcher's units not sharded now, by index. (Asserts name the prefetcher, not the units: `Unit`'s repr
    reads a sharded unit's freed storage, a segfault instead of a failure report.)"""
    return {u.index: u.params_state for u in prefetcher.units if u.params_state is not ParamState.SHARDED}


def test_each_unit_is_ready_once_per_backward_as_its_last_gradient_arrives() -> None:
    model = Net()
    units, ready = units_of(model, Stage.GRADIENTS), list[int]()
    GradReadyHooks(units, lambda u: ready.append(u.index))
    for _ in range(2):
        GradReadyHooks.arm(units)
        assert {u.grads_state for u in units} == {GradState.ACCUMULATING}
        model(torch.randn(2, 4)).sum().backward()
    assert ready == [3, 2, 1, 0] * 2  # backward reaches the head first
    assert all(u.grads_left == 0 and u.grads_state is GradState.READY for u in units)


def test_a_parameter_used_twice_counts_once_and_one_without_gradient_holds_its_unit_back() -> None:
    model = Net()
    model.parts[1].twice = True
    model.parts[2].use_spare = False
    units, ready = units_of(model, Stage.GRADIENTS), list[int]()
    GradReadyHooks(units, lambda u: ready.append(u.index))
    GradReadyHooks.arm(units)
    model(torch.randn(2, 4)).sum().backward()
    assert ready == [3, 1, 0]  # the engine reduces unit 2 at the end of backward
    assert units[2].grads_left == 1 and units[2].grads_state is GradState.ACCUMULATING


def test_on_input_grad_runs_once_after_the_module_s_backward_and_wraps_only_grad_requiring_tensors() -> None:
    events: list[str] = []
    a, b, s = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True), torch.ones(2)
    args, kwargs = on_input_grad((a, 7), {"b": b, "s": s}, lambda: events.append("after"))
    assert args[1] == 7 and kwargs["s"] is s and args[0] is not a  # only grad-requiring tensors are passed through
    h = args[0] * kwargs["b"]
    h.register_hook(lambda _g: events.append("module"))
    (h * 2).sum().backward()
    assert events == ["module", "after"]
    assert torch.equal(a.grad, 2 * b.detach()) and torch.equal(b.grad, 2 * a.detach())  # type: ignore[arg-type]
    plain = ((torch.ones(2),), {"k": 1})  # nothing needs a gradient: the call is left as it is
    assert on_input_grad(*plain, lambda: None) == plain
    with torch.no_grad():
        assert on_input_grad((a,), {}, lambda: None)[0][0] is a


def test_on_output_grad_runs_once_before_the_module_s_backward_even_after_in_place_changes() -> None:
    events: list[str] = []
    x = torch.randn(3, requires_grad=True)
    h = x * 2
    h.register_hook(lambda _g: events.append("module"))
    first, second = h * 3, h + 1
    on_output_grad({"a": first, "b": [second, 5]}, lambda: events.append("output"))
    first += 1  # the caller may modify the output in place: the hook is on the tensors, not a wrapper
    (first.sum() + second.sum()).backward()
    assert events == ["output", "module"]  # once for both outputs ("any")
    with torch.no_grad():
        on_output_grad(x, lambda: events.append("no grad"))
    (x * 1).sum().backward()
    assert events == ["output", "module"]


def stage3(frozen: bool = False) -> tuple[Net, Prefetcher, dict[str, Seen]]:
    """Stage-3 units with the prefetcher installed (one module ahead), and what each block's forward and backward
    find held, in the order the blocks ran."""
    model = Net()
    for block in model.parts:
        block.spare.requires_grad_(not frozen)  # frozen: a twin unit beside each block's, same module
    prefetcher = Prefetcher(units_of(model, Stage.PARAMETERS), 1)
    prefetcher.install()
    seen: dict[str, Seen] = {"forward": [], "backward": []}
    for block in model.parts:
        block.probe = lambda phase: seen[phase].append(held(prefetcher))
    return model, prefetcher, seen


def run_forward(model: Net, prefetcher: Prefetcher) -> torch.Tensor:
    roots = [u for u in prefetcher.units if u.layout.module is None]
    prefetcher.begin_forward(roots)
    return prefetcher.end_forward(roots, model(torch.randn(2, 4)))


def test_forward_gathers_each_unit_with_the_next_prefetched_and_frees_it_after() -> None:
    gathered = Net()  # stages 0-2: every unit stays gathered, so no hook is installed
    idle = Prefetcher(units_of(gathered, Stage.GRADIENTS), 1)
    idle.install()
    assert not idle.active and not any(b._forward_pre_hooks or b._forward_hooks for b in gathered.blocks)
    model, prefetcher, seen = stage3()
    assert prefetcher.active and held(prefetcher) == {}
    run_forward(model, prefetcher)
    assert seen["forward"] == [{0: G, 1: F, 3: G}, {1: G, 2: F, 3: G}, {2: G, 3: G}]
    assert prefetcher.prefetches == 3 and prefetcher.order == [0, 1, 2]
    assert held(prefetcher) == {3: G}  # the root stays gathered into backward, which needs it first


def run_step(model: Net, prefetcher: Prefetcher) -> None:
    out = run_forward(model, prefetcher)
    trainable = [u for u in prefetcher.units if not u.layout.frozen]
    GradReadyHooks(trainable, lambda u: u.reshard())  # as the engine frees a unit once its gradients are reduced
    GradReadyHooks.arm(trainable)
    prefetcher.begin_backward()
    out.sum().backward()


def test_backward_gathers_units_in_reverse_with_the_previous_one_prefetched() -> None:
    model, prefetcher, seen = stage3()
    run_step(model, prefetcher)
    assert seen["backward"] == [{1: F, 2: G}, {0: F, 1: G}, {0: G}]
    assert held(prefetcher) == {} and prefetcher.backward_seen == {0, 1, 2, 3}
    prefetcher.replay_pre_backward(0)  # seen in this backward: nothing to replay
    assert held(prefetcher) == {}
    prefetcher.begin_backward()
    prefetcher.replay_pre_backward(0)  # never reached by this backward: gathered as its pre-backward would
    assert held(prefetcher) == {0: G}


def test_a_frozen_twin_goes_with_its_unit_and_is_freed_once_backward_has_the_module_s_input_gradients() -> None:
    model, prefetcher, seen = stage3(frozen=True)
    names = [u.name for u in prefetcher.units]
    assert names[:2] == ["blocks.0", "blocks.0/frozen"] and names[6] == "<root>"
    run_step(model, prefetcher)
    assert seen["forward"][0] == {0: G, 1: G, 2: F, 3: F, 6: G}  # prefetching counts modules: block 1's two units
    assert seen["backward"] == [{2: F, 3: F, 4: G, 5: G}, {0: F, 1: F, 2: G, 3: G}, {0: G, 1: G}]
    assert held(prefetcher) == {1: G}  # block 0's input needs no gradient: the engine frees its twin at the end


def test_gathers_follow_last_iteration_s_order_so_a_unit_run_early_gathers_those_scheduled_before_it() -> None:
    model, prefetcher, seen = stage3()
    with torch.no_grad():
        run_forward(model, prefetcher)
        model.order = [2, 1, 0]
        run_forward(model, prefetcher)
        # Units 0 and 1 come first in the schedule: block 2 running first issues their gathers too.
        assert seen["forward"][3] == {0: F, 1: F, 2: G, 3: G}
        assert prefetcher.order == [2, 1, 0]
        assert held(prefetcher) == {}  # without grad the root is freed too
        prefetcher.begin_forward([prefetcher.units[3]])
    assert held(prefetcher) == {2: F, 3: G}
