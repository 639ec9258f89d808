"""Flat layout of a model's parameters in partition units: pure arithmetic, no storage, no collectives.

Each unit (one module whose class is named in `unit_modules`, or the root unit holding every other
parameter) becomes one flat 1-D buffer padded to a multiple of the world size N, so every rank owns
one contiguous shard of exactly `padded / N` elements (gloo has no uneven collectives).

Inside a unit the parameters are ordered by optimizer class: weight-decayed trainable parameters
first, then trainable parameters excluded from weight decay, then padding. A rank's shard therefore meets at most
one contiguous run of each class, so the optimizer gets at most two flat views per unit (one per weight-decay
group) and stays element-wise exact.

Frozen parameters (`requires_grad=False`: a LoRA job's base) form a unit of their own beside their module's
trainable one, named `<unit>/frozen`, sharded the same way. It is held in the compute dtype only, with no fp32
master, gradient or optimizer state, and, being its own flat buffer, it is spread over the ranks as evenly as the
trainable unit is (were both in one buffer, the small trainable run would sit on rank 0's shard alone).

Every parameter starts at a multiple of `ALIGN` elements and so does every rank's shard: an odd-sized tensor
(a 50,257-token vocabulary) would otherwise leave every later weight view and every shard start misaligned for
cuBLAS's vectorised kernels and NCCL's copies. The gaps are zeros that stay zero (no gradient reaches them, and
AdamW or SGD leave a zero with a zero gradient at zero), counted as padding.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from enum import IntEnum

from torch import nn

from zerotrain.plan.peak import ALIGN, align_up, padded_elements
from zerotrain.runtime.zero.engine_errors import ZeroSetupError

ROOT_UNIT = "<root>"
FROZEN_SUFFIX = "/frozen"
"""Appended to a unit's name for the unit of its frozen parameters."""


class ParamClass(IntEnum):
    """Optimizer class of a parameter; the value is its order inside a unit's flat buffer."""

    DECAY = 0
    NO_DECAY = 1
    FROZEN = 2


@dataclass(frozen=True)
class ParamSlot:
    """One parameter's place in its unit's flat buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    kind: ParamClass


@dataclass(frozen=True)
class Segment:
    """A run of elements, `[start, stop)` in unit coordinates, of one optimizer class."""

    start: int
    stop: int
    kind: ParamClass


@dataclass
class UnitLayout:
    """One unit's flat buffer: where each parameter sits and which elements each rank owns."""

    name: str
    slots: list[ParamSlot]
    world_size: int
    numel: int = 0
    """Parameter elements (Ψ of this unit)."""
    extent: int = 0
    """Elements up to the end of the last parameter: `numel` plus the alignment gaps between parameters."""
    padded: int = 0
    """The flat buffer's size: `extent` rounded up so every rank's shard is `ALIGN`-aligned and equal."""
    module: nn.Module | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.numel = sum(s.numel for s in self.slots)
        self.extent = max((s.offset + s.numel for s in self.slots), default=0)
        self.padded = padded_elements(self.extent, self.world_size)

    @property
    def frozen(self) -> bool:
        """Every parameter of the unit is frozen: it holds values only (no master, gradient or optimizer state)."""
        return bool(self.slots) and all(s.kind is ParamClass.FROZEN for s in self.slots)

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """`[start, stop)` of rank's shard in unit coordinates."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def class_segments(self) -> list[Segment]:
        """The contiguous run of each optimizer class (empty classes left out)."""
        out: list[Segment] = []
        for kind in ParamClass:
            members = [s for s in self.slots if s.kind is kind]
            if members:
                out.append(Segment(members[0].offset, members[-1].offset + members[-1].numel, kind))
        return out

    def shard_segments(self, rank: int, kinds: tuple[ParamClass, ...]) -> list[Segment]:
        """Runs of the given classes inside rank's shard, in shard-local coordinates."""
        lo, hi = self.shard_range(rank)
        out = []
        for seg in self.class_segments():
            a, b = max(seg.start, lo), min(seg.stop, hi)
            if seg.kind in kinds and a < b:
                out.append(Segment(a - lo, b - lo, seg.kind))
        return out


def _unit_roots(model: nn.Module, unit_modules: list[str]) -> list[tuple[str, nn.Module]]:
    """Outermost modules whose class is named in `unit_modules` (a unit nested in a unit belongs to the outer one)."""
    wanted = set(unit_modules)
    found: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if type(mod).__name__ in wanted and not any(name.startswith(f"{p}.") for p, _ in found):
            found.append((name, mod))
    return found


def check_unit_classes(model: nn.Module, unit_modules: list[str]) -> None:
    present = {type(m).__name__ for m in model.modules()}
    for i, cls in enumerate(unit_modules):
        if cls not in present:
            raise ZeroSetupError(
                f"zero.unitModules[{i}]",
                cls,
                "no module of the model has this class",
                f"use class names the model contains, e.g. one of {sorted(present)}",
            )


def _param_users(model: nn.Module, unit_names: list[str]) -> dict[int, set[str]]:
    """For each parameter, the units (or the root) whose modules hold it directly."""
    users: dict[int, set[str]] = {}
    for mname, mod in model.named_modules():
        owner = next((u for u in unit_names if mname == u or mname.startswith(f"{u}.")), ROOT_UNIT)
        for p in mod._parameters.values():
            if p is not None:
                users.setdefault(id(p), set()).add(owner)
    return users


def _param_class(name: str, param: nn.Parameter, no_weight_decay: list[str]) -> ParamClass:
    if not param.requires_grad:
        return ParamClass.FROZEN
    if any(fnmatch.fnmatchcase(name, pat) for pat in no_weight_decay):
        return ParamClass.NO_DECAY
    return ParamClass.DECAY


def build_units(
    model: nn.Module, unit_modules: list[str], no_weight_decay: list[str], world_size: int
) -> list[UnitLayout]:
    """The units in module registration order, root unit last, each module's frozen parameters in a unit of their
    own right after its trainable one; validates the model against the config first.

    A parameter shared by two units (tied weights) moves to the root unit, which stays gathered for
    the whole forward and backward in stage 3, so every user of it sees it.
    """
    params = dict(model.named_parameters())
    if not params:
        raise ZeroSetupError(
            "model", type(model).__name__, "the model has no parameters", "pass a model with parameters"
        )
    check_unit_classes(model, unit_modules)
    total = sum(p.numel() for p in params.values())
    if world_size > total:
        raise ZeroSetupError(
            "WORLD_SIZE",
            world_size,
            f"more ranks than the model has parameters ({total})",
            "use fewer ranks or a bigger model",
        )
    owner_names = {id(p): n for n, p in params.items()}
    roots = _unit_roots(model, unit_modules)
    users = _param_users(model, [u for u, _ in roots])
    units = []
    taken: set[int] = set()
    for uname, mod in roots:
        mine = [p for p in mod.parameters() if users[id(p)] == {uname}]
        taken.update(id(p) for p in mine)
        names = [owner_names[id(p)] for p in mine]
        units += _layouts(uname, names, params, no_weight_decay, world_size, mod)
    rest = [n for n, p in params.items() if id(p) not in taken]
    return units + _layouts(ROOT_UNIT, rest, params, no_weight_decay, world_size, None)


def _layouts(
    uname: str,
    names: list[str],
    params: dict[str, nn.Parameter],
    no_weight_decay: list[str],
    world_size: int,
    module: nn.Module | None,
) -> list[UnitLayout]:
    """The module's trainable unit and its frozen one, each only when it has parameters."""
    trainable = [n for n in names if params[n].requires_grad]
    frozen = [n for n in names if not params[n].requires_grad]
    out = []
    if trainable:
        out.append(_layout(uname, trainable, params, no_weight_decay, world_size, module))
    if frozen:
        out.append(_layout(uname + FROZEN_SUFFIX, frozen, params, no_weight_decay, world_size, module))
    return out


def _layout(
    uname: str,
    names: list[str],
    params: dict[str, nn.Parameter],
    no_weight_decay: list[str],
    world_size: int,
    module: nn.Module | None,
) -> UnitLayout:
    classed = sorted(((_param_class(n, params[n], no_weight_decay), i, n) for i, n in enumerate(names)))
    slots, offset = [], 0
    for kind, _, n in classed:
        p = params[n]
        slots.append(ParamSlot(n, tuple(p.shape), offset, p.numel(), kind))
        offset = align_up(offset + p.numel(), ALIGN)
    return UnitLayout(uname, slots, world_size, module=module)
