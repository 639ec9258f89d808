"""Counting the bytes a rank's collectives move, whoever calls them.

`CommCounter` is a TorchDispatchMode: every torch.distributed collective reaches the dispatcher as a `c10d.*`
op (or a `_c10d_functional.*` one), including the ones DDP's C++ reducer issues from backward, so one counter
serves DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed and zerotrain alike. Dispatching every op through Python
costs time, so the benchmark counts one untimed step.

Byte convention, the same as zerotrain's `comm_report()` (the ZeRO paper's ring accounting, per rank): for a
full tensor of n·e bytes over N ranks, all-gather and reduce-scatter send n·e·(N-1)/N, all-reduce twice that,
broadcast n·e from the source and nothing from the others, N being the size of the op's own process group (a shard
group's, under hybrid sharding). Ops this table does not know are counted at their payload under their own name, so
they show up rather than vanish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:  # a NewType of str, where this torch's stubs name it
    from torch.distributed.distributed_c10d import GroupName


def _nbytes(tensors: Any) -> int:
    """Bytes of a tensor or of a (nested) list of tensors."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, (list, tuple)):
        return sum(_nbytes(t) for t in tensors)
    return 0


def _ring(n: int, world: int) -> int:
    return n * (world - 1) // world


# op name -> (bytes this rank sends, full-tensor payload) from the op's arguments and the world size.
_Rule = Callable[[tuple[Any, ...], int, int], tuple[int, int]]


def _all_gather(out_index: int) -> _Rule:
    return lambda a, n, _r: (_ring(_nbytes(a[out_index]), n), _nbytes(a[out_index]))


def _reduce_scatter(in_index: int) -> _Rule:
    return lambda a, n, _r: (_ring(_nbytes(a[in_index]), n), _nbytes(a[in_index]))


def _all_reduce(a: tuple[Any, ...], n: int, _r: int) -> tuple[int, int]:
    return 2 * _ring(_nbytes(a[0]), n), _nbytes(a[0])


def _broadcast(a: tuple[Any, ...], n: int, rank: int) -> tuple[int, int]:
    # c10d.broadcast_(tensors, process_group, root_rank, root_tensor, ...)
    return (_nbytes(a[0]) if n > 1 and int(a[2]) == rank else 0), _nbytes(a[0])


def _functional_all_gather(a: tuple[Any, ...], n: int, _r: int) -> tuple[int, int]:
    full = _nbytes(a[0]) * n  # the functional op takes the shard and returns the gathered tensor
    return _ring(full, n), full


RULES: dict[str, _Rule] = {
    "c10d.allreduce_": _all_reduce,
    "c10d.allreduce_coalesced_": _all_reduce,
    "c10d.broadcast_": _broadcast,
    "c10d._allgather_base_": _all_gather(0),
    "c10d.allgather_": _all_gather(0),
    "c10d.allgather_into_tensor_coalesced_": _all_gather(0),
    "c10d.allgather_coalesced_": _all_gather(0),
    "c10d._reduce_scatter_base_": _reduce_scatter(1),
    "c10d.reduce_scatter_": _reduce_scatter(1),
    "c10d.reduce_scatter_tensor_coalesced_": _reduce_scatter(1),
    "_c10d_functional.all_reduce": _all_reduce,
    "_c10d_functional.all_reduce_": _all_reduce,
    "_c10d_functional.all_gather_into_tensor": _functional_all_gather,
    "_c10d_functional.reduce_scatter_tensor": _reduce_scatter(0),
}
IGNORED = {"c10d.barrier", "c10d.monitored_barrier_", "_c10d_functional.wait_tensor"}


ACROSS = " (across groups)"
"""Suffix of an op run on a group whose ranks lie in more than one shard group: hybrid sharding's replica groups,
and the world."""


def _group(args: tuple[Any, ...]) -> dist.ProcessGroup | None:
    """The process group a c10d op runs on (an argument), or a functional op's (named by its last argument)."""
    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a
        if isinstance(a, torch.ScriptObject):  # how the dispatcher passes a c10d op its group
            try:
                return dist.ProcessGroup.unbox(a)
            except (RuntimeError, TypeError):
                continue
    if args and isinstance(args[-1], str):
        try:
            return _resolve_process_group(cast("GroupName", args[-1]))
        except (KeyError, ValueError, RuntimeError):
            return None
    return None


class CommCounter(TorchDispatchMode):
    """Per-op calls, bytes sent (ring convention, over the op's own group) and payload of the collectives run while
    it is active; with `shard_group` S, ops on groups that span several groups of S ranks are counted apart."""

    def __init__(self, rank: int, world_size: int, shard_group: int = 0) -> None:
        super().__init__()
        self.rank, self.world_size, self.shard_group = rank, world_size, shard_group
        self.ops: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(
        self, func: Any, types: Iterable[type], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func.namespace in ("c10d", "_c10d_functional"):
            self._record(func.name().split("::")[-1].split(".")[0], func.namespace, args)
        return func(*args, **(kwargs or {}))

    def _where(self, args: tuple[Any, ...]) -> tuple[int, int, bool]:
        """(group size, this rank's index in it, whether the group crosses shard groups)."""
        group = _group(args)
        if group is None:
            return self.world_size, self.rank, False
        ranks = dist.get_process_group_ranks(group)
        s = self.shard_group
        # World-wide ops (DDP's all-reduce, a plain system's every op) cross between the groups too.
        across = 0 < s < self.world_size and len({r // s for r in ranks}) > 1
        return len(ranks), ranks.index(self.rank) if self.rank in ranks else 0, across

    def _record(self, name: str, namespace: str, args: tuple[Any, ...]) -> None:
        op = f"{namespace}.{name}"
        if op in IGNORED:
            return
        rule = RULES.get(op)
        size, index, across = self._where(args)
        sent, payload = rule(args, size, index) if rule else (_nbytes(args), _nbytes(args))
        op += ACROSS if across else ""
        s = self.ops.setdefault(op, {"calls": 0, "bytes": 0, "payload_bytes": 0})
        s["calls"] += 1
        s["bytes"] += sent
        s["payload_bytes"] += payload

    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.ops.values())

    def across_bytes(self) -> int:
        """Bytes of the ops between shard groups (0 without hybrid sharding)."""
        return sum(s["bytes"] for op, s in self.ops.items() if op.endswith(ACROSS))
