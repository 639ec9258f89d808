"""A parameter handed over to a placeholder: the rank keeps its slice of the values, the module a meta tensor.

Every rank builds every module with the same seed, so every rank computes the same values; each keeps only slice
r of W of each parameter's flattened values (ceil(numel / W) elements, the last slices padded with zeros), and the
parameter itself becomes a placeholder on the meta device: the same `nn.Parameter` object (hooks, ties and
attributes such as Hugging Face's `_is_hf_initialized` stay), with its shape, dtype and `requires_grad`, holding no
memory. Reading a placeholder's values is impossible by construction (a meta tensor has none), so a model that reads
its weights while it is built cannot be silently given other ones (`deferred` catches it).

The slices are what `materialize` gathers, one unit at a time, when the engine builds that unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class CannotPartition(RuntimeError):
    """The model's construction cannot be partitioned; the message says why (the rank then builds it whole)."""


@dataclass(frozen=True)
class Geometry:
    """Where a view lies in its parameter: size, stride and storage offset."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, t: torch.Tensor) -> Geometry:
        return cls(tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))


@dataclass
class Deferred:
    """An in-place operation on a parameter after it was handed over, to run again on its real values."""

    func: Any
    """The callable as it was called (`torch.nn.init.normal_`, `torch.Tensor.zero_`, `Tensor.__setitem__`)."""
    target: Geometry
    """The view of the parameter it wrote into (the whole parameter, or a slice such as `weight[padding_idx]`)."""
    args: tuple[Any, ...]
    """The arguments after the target."""
    kwargs: dict[str, Any]
    rng: torch.Tensor
    """The CPU generator's state just before the operation ran: its random draws are the same when replayed."""
    generators: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)
    """Generators passed explicitly, each with its state just before the operation."""


@dataclass
class Held:
    """What the rank keeps of one parameter: its slice, and the operations that wrote into it afterwards."""

    param: nn.Parameter
    where: str
    """`Module.name` it was registered under, for messages (its qualified name is known only later)."""
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    piece: torch.Tensor
    """This rank's slice of the flattened values, `width` elements (zeros past the end)."""
    deferred: list[Deferred] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return math.prod(self.size)


def slice_width(numel: int, world_size: int) -> int:
    return -(-numel // world_size)


def to_meta(param: nn.Parameter) -> None:
    """Swap the parameter's storage for a meta tensor of the same geometry, keeping the object and its attributes."""
    attrs = dict(param.__dict__)
    meta = torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device="meta")
    torch.utils.swap_tensors(param, nn.Parameter(meta, requires_grad=param.requires_grad))
    param.__dict__.update(attrs)


def from_meta(param: nn.Parameter, values: torch.Tensor) -> None:
    """Give a placeholder real storage: `values` (same geometry) become the parameter's data, object kept."""
    attrs = dict(param.__dict__)
    torch.utils.swap_tensors(param, nn.Parameter(values, requires_grad=param.requires_grad))
    param.__dict__.update(attrs)


class Slices:
    """Every handed-over parameter of one construction, found by its placeholder's storage (views of a placeholder
    share it, so `weight.data[0]` is recognised as part of `weight`)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.by_storage: dict[int, Held] = {}

    def held(self, t: torch.Tensor) -> Held | None:
        """The parameter `t` is (a view of), when it is a placeholder of this construction."""
        if not t.is_meta:
            return None
        return self.by_storage.get(t.untyped_storage()._cdata)

    def take(self, param: nn.Parameter, where: str) -> None:
        """Keep this rank's slice of `param` and make it a placeholder (a placeholder already is one)."""
        if param.is_meta:
            if self.held(param) is None:
                raise CannotPartition(f"{where} is on the meta device already, so its values are not known")
            return
        if param.device.type != "cpu":
            raise CannotPartition(f"{where} is built on {param.device}; the entry point builds the model on the CPU")
        width = slice_width(param.numel(), self.world_size)
        piece = torch.zeros(width, dtype=param.dtype)
        flat = param.detach().reshape(-1)[self.rank * width : (self.rank + 1) * width]
        piece[: flat.numel()] = flat
        held = Held(param, where, tuple(param.shape), tuple(param.stride()), param.dtype, piece)
        try:
            to_meta(param)
        except RuntimeError as e:  # something holds a view of it, or a weak reference
            raise CannotPartition(f"{where} cannot be handed over ({str(e).splitlines()[0]})") from None
        self.by_storage[param.untyped_storage()._cdata] = held

    def reset(self, held: Held, values: torch.Tensor) -> None:
        """`param.data = values` on a placeholder: the new values are the parameter's, earlier writes are moot."""
        if tuple(values.shape) != held.size:
            raise CannotPartition(f"{held.where}.data is replaced by a tensor of another shape {tuple(values.shape)}")
        flat = values.detach().to(held.dtype).reshape(-1)[self.rank * held.piece.numel() :][: held.piece.numel()]
        held.piece.zero_()
        held.piece[: flat.numel()] = flat
        held.deferred.clear()

    def keep_only(self, params: set[int]) -> None:
        """Forget parameters the finished model no longer holds (a weight replaced by a tie)."""
        self.by_storage = {k: h for k, h in self.by_storage.items() if id(h.param) in params}

    def of_param(self, param: nn.Parameter) -> Held | None:
        return self.held(param)
