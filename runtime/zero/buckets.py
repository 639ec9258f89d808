"""ZeRO-R constant-size communication buffers: chunking of unit reductions and gathers, and one persistent pool
of at most `depth` fixed-size buffers per dtype, with the collectives that hold them.

A unit's flat buffer of N·S elements is reduced (or gathered) in chunks of shard columns `[a, b)`:
the chunk's bucket holds rows `r·S + [a, b)` for every rank r, so a reduce-scatter of the bucket
leaves exactly this rank's shard elements `[a, b)` here, whatever the chunk size. A chunk holds at
most `bucket_elements` elements (at least one column per rank, which the configuration checks).

Every buffer the pool lends is a view of one of its fixed-size buffers: allocated the first time it is needed,
sized for the largest chunk any unit can ask for (the bucket plus the chunk's own output, or less when the model's
units are smaller than that), and kept for the whole run. So buffer bytes do not grow with depth, nothing is
allocated for communication after the first step, and when `depth` buffers are lent to collectives still in
flight the oldest is finished before lending again: up to `depth` reductions overlap the rest of backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerotrain.plan.peak import chunk_width
from zerotrain.runtime.zero.collectives import Comm, Pending
from zerotrain.runtime.zero.streams import HostStreams, SideWork


@dataclass
class Then:
    """A second collective on a chunk's buffer, launched once the first has finished (hybrid sharding: the
    all-reduce across groups of what the reduce-scatter left): queued on the side stream and tracked like the first,
    the buffer lent until its `finish` ran."""

    send: Callable[[], Pending]
    finish: Callable[[], None]


Finish = Callable[[], "Then | None"]
"""Applies a collective's result on the compute stream; may hand the buffer on to a second collective."""


def chunks(shard_numel: int, world_size: int, bucket_elements: int) -> list[tuple[int, int]]:
    """Shard-column ranges `[a, b)` whose buckets (world_size·(b-a) elements) fit `bucket_elements`."""
    width = chunk_width(world_size, bucket_elements)
    return [(a, min(a + width, shard_numel)) for a in range(0, shard_numel, width)]


class BucketPool:
    """Lends views of persistent fixed-size buffers and tracks the collectives using them (oldest finished first)."""

    def __init__(self, comm: Comm, capacity: int = 0, depth: int = 2) -> None:
        self.comm, self.capacity, self.depth = comm, capacity, depth
        self.streams = HostStreams()
        """Set to the device's streams by the engine: copies and launches run on the side stream, results are
        applied on the compute stream after it waited for them."""
        self._free: dict[torch.dtype, list[torch.Tensor]] = {}
        self._lent = 0
        self._inflight: deque[tuple[SideWork[Pending], Finish, torch.Tensor | None]] = deque()

    def acquire(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A view of `numel` elements of a pooled buffer; may first finish the oldest collective in flight."""
        if numel > self.capacity:
            raise ValueError(f"a chunk of {numel} elements exceeds the pool's fixed {self.capacity}: chunk it first")
        while self._lent >= self.depth and self._inflight:
            self.finish_oldest()
        free = self._free.setdefault(dtype, [])
        if not free:
            buf = torch.empty(self.capacity, dtype=dtype, device=device)
            self.comm.stats.hold(buf)
            free.append(buf)
        self._lent += 1
        return free.pop()[:numel]

    def give_back(self, buf: torch.Tensor) -> None:
        self._lent -= 1
        base = buf._base if buf._base is not None else buf
        self._free[base.dtype].append(base)

    @property
    def inflight(self) -> bool:
        return bool(self._inflight)

    def launch(self, fn: Callable[[], Pending], finish: Finish, buf: torch.Tensor | None) -> SideWork[Pending]:
        """Queue `fn` (copy-in and the collective's launch) on the side stream and track it: `finish` runs on the
        compute stream once compute waited for both the side work and the collective, then `buf` (if any) returns
        to the pool, unless `finish` hands it to a second collective (`Then`), queued now behind the younger ones.
        The ticket tells when memory `fn` reads may be reused."""
        ticket = self.streams.side(fn)
        self._inflight.append((ticket, finish, buf))
        return ticket

    def finish_oldest(self) -> None:
        ticket, finish, buf = self._inflight.popleft()
        self.streams.wait(ticket).wait()
        then = finish()
        if then is not None:
            self._inflight.append((self.streams.side(then.send), then.finish, buf))
            return
        if buf is not None:
            self.give_back(buf)

    def drain(self) -> None:
        """Finish every collective in flight; the buffers stay for the next step."""
        while self._inflight:
            self.finish_oldest()
