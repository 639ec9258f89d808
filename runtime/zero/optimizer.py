"""Any element-wise torch optimizer over the rank's flat fp32 master shard(s).

The factory the user passes receives torch param groups whose params are flat views into the
master shards (at most one per unit and weight-decay class, see `partition`), with `.grad` views
into the matching fp32 gradient shards. The group of parameters matched by `zero.noWeightDecay`
carries `weight_decay=0`; the other group inherits the factory's default. Because every allowed
optimizer updates each element from that element's own gradient and state only, stepping the
shards is exactly stepping the unsharded model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.partition import ParamClass

OptimizerFactory = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]

# Element-wise: each element's update reads only its own gradient and state (and shared scalars).
ELEMENTWISE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.RMSprop,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.ASGD,
)


def check_factory(factory: OptimizerFactory) -> None:
    """Build the optimizer once on a probe parameter and refuse non-element-wise ones, before any collective."""
    probe = nn.Parameter(torch.zeros(1))
    opt = factory([{"params": [probe]}])
    if [p for g in opt.param_groups for p in g["params"]] != [probe]:
        raise ZeroSetupError(
            "optimizer",
            type(opt).__name__,
            "the factory did not build the optimizer over the param groups it was given",
            "pass the factory's argument to the optimizer: lambda groups: torch.optim.AdamW(groups, lr=...)",
        )
    if not isinstance(opt, ELEMENTWISE):
        raise ZeroSetupError(
            "optimizer",
            type(opt).__name__,
            "not an element-wise optimizer, so it cannot run on a flat shard of the parameters",
            f"use one of {', '.join(c.__name__ for c in ELEMENTWISE)}",
        )


def shard_params(
    master: torch.Tensor, grad: torch.Tensor, segments: list[tuple[int, int, ParamClass]]
) -> list[tuple[ParamClass, nn.Parameter]]:
    """One leaf parameter per segment, sharing storage with `master`, its `.grad` a view of `grad`."""
    out = []
    for a, b, kind in segments:
        p = nn.Parameter(master[a:b])
        p.grad = grad[a:b]
        out.append((kind, p))
    return out


def param_groups(params: list[tuple[ParamClass, nn.Parameter]]) -> list[dict[str, Any]]:
    """The decayed group (factory default weight decay) and the no-decay group (weight_decay=0)."""
    decay = [p for k, p in params if k is ParamClass.DECAY]
    no_decay = [p for k, p in params if k is ParamClass.NO_DECAY]
    groups: list[dict[str, Any]] = []
    if decay:
        groups.append({"params": decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    if not groups:
        # This rank's shards hold only frozen elements or padding; torch refuses an empty optimizer.
        groups.append({"params": [nn.Parameter(torch.zeros(0))]})
    return groups


def check_uses_groups(opt: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    given = {id(p) for g in groups for p in g["params"]}
    used = {id(p) for g in opt.param_groups for p in g["params"]}
    if given != used:
        raise ZeroSetupError(
            "optimizer",
            type(opt).__name__,
            "the factory did not build the optimizer over the param groups it was given",
            "pass the factory's argument to the optimizer: lambda groups: torch.optim.AdamW(groups, lr=...)",
        )


def state_bytes_per_element(opt: torch.optim.Optimizer) -> float | None:
    """Bytes of per-element state per parameter element (scalars like Adam's `step` left out); None before a step."""
    elems = sum(p.numel() for g in opt.param_groups for p in g["params"])
    if not opt.state or elems == 0:
        return None
    per = 0
    for st in opt.state.values():
        per += sum(t.numel() * t.element_size() for t in st.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
    return per / elems


def configured_state_bytes(opt: torch.optim.Optimizer) -> float | None:
    """Per-element optimizer state bytes the optimizer's kind and settings imply (fp32 state, as torch keeps it for
    fp32 parameters), known before any step and independent of what is allocated; None for a kind not listed."""
    groups = opt.param_groups
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return 12.0 if any(g.get("amsgrad") for g in groups) else 8.0  # exp_avg, exp_avg_sq (, max_exp_avg_sq)
    if isinstance(opt, torch.optim.SGD):
        return 4.0 if any(g.get("momentum", 0) for g in groups) else 0.0  # the momentum buffer
    if isinstance(opt, torch.optim.Adagrad):
        return 4.0  # sum
    if isinstance(opt, torch.optim.RMSprop):
        g = groups[0]
        return 4.0 + (4.0 if g.get("momentum", 0) else 0.0) + (4.0 if g.get("centered") else 0.0)
    return None
