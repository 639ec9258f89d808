"""ZeRO-R constant-size communication buffers: chunking of unit reductions and gathers, and a pool of
at most `depth` reusable buffers with the collectives that hold them.

A unit's flat buffer of N·S elements is reduced (or gathered) in chunks of shard columns `[a, b)`:
the chunk's bucket holds rows `r·S + [a, b)` for every rank r, so a reduce-scatter of the bucket
leaves exactly this rank's shard elements `[a, b)` here, whatever the chunk size. A chunk holds at
most `bucket_elements` elements (at least one column). The pool lends a buffer per chunk and, when
`depth` are lent to collectives still in flight, finishes the oldest before lending again: memory
for reduction buffers stays below `depth × bucket_elements` however large the model, and up to
`depth` reductions overlap the rest of backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from zerotrain.runtime.collectives import Comm, Pending


def chunks(shard_numel: int, world_size: int, bucket_elements: int) -> list[tuple[int, int]]:
    """Shard-column ranges `[a, b)` whose buckets (world_size·(b-a) elements) fit `bucket_elements`."""
    width = max(1, bucket_elements // world_size)
    return [(a, min(a + width, shard_numel)) for a in range(0, shard_numel, width)]


class BucketPool:
    """Lends reusable buffers and tracks the collectives using them (oldest finished first)."""

    def __init__(self, comm: Comm, depth: int = 2) -> None:
        self.comm, self.depth = comm, depth
        self._free: list[torch.Tensor] = []
        self._lent = 0
        self._inflight: deque[tuple[Pending, Callable[[], None], torch.Tensor | None]] = deque()

    def acquire(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer view of `numel` elements; may first finish the oldest collective in flight."""
        while self._lent >= self.depth and self._inflight:
            self.finish_oldest()
        fit = next((b for b in self._free if b.numel() >= numel and b.dtype == dtype), None)
        if fit is None:
            if self._free:  # too small or wrong dtype: replace it, so at most `depth` buffers exist
                self.comm.stats.release(self._free.pop())
            fit = torch.empty(numel, dtype=dtype, device=device)
            self.comm.stats.hold(fit)
        else:
            self._free.remove(fit)
        self._lent += 1
        return fit[:numel]

    def give_back(self, buf: torch.Tensor) -> None:
        self._lent -= 1
        base = buf._base if buf._base is not None else buf
        self._free.append(base)

    def submit(self, work: Pending, finish: Callable[[], None], buf: torch.Tensor | None) -> None:
        """Track a collective; `finish` runs after it completes, then `buf` (if any) returns to the pool."""
        self._inflight.append((work, finish, buf))

    def finish_oldest(self) -> None:
        work, finish, buf = self._inflight.popleft()
        work.wait()
        finish()
        if buf is not None:
            self.give_back(buf)

    def drain(self) -> None:
        """Finish every collective in flight and free the pooled buffers (nothing is held between steps)."""
        while self._inflight:
            self.finish_oldest()
        for b in self._free:
            self.comm.stats.release(b)
        self._free.clear()
