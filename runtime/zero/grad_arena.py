"""Contiguous gradients (ZeRO-R's memory defragmentation): a unit's unsharded gradients land in a pre-allocated
arena, as views set as the parameters' `.grad` just before the unit's backward, and are reduce-scattered from it.

Stages 2 and 3 drop unsharded gradients after every micro-batch's reduction. Left to autograd, each parameter's
gradient is a fresh allocation every micro-batch, freed moments later: the churn that fragments a caching
allocator. Here two arenas, each the size of the largest unit's flat buffer, serve every unit in turn (a third is
made only if a schedule ever needs it), and the root unit, whose gradients accumulate over the whole backward,
has one of its own. Only units of at most `reduceBucketElements` elements are served (each is then reduced in one
chunk), so the arenas, kept for the whole run, are bounded by the configuration and not by the model: a larger
unit's gradients are autograd's, reduced and freed as without contiguous gradients (raise the bucket to keep it
contiguous). An arena goes back once the reduction reading it has its data: either the collective read it
directly and finished, or its chunks were queued to be copied into buckets, and then the arena carries the ticket
of the last copy, which the next unit's `bind` waits for before zeroing it (on CUDA those copies run on the side
stream, so reusing the arena earlier would send the next unit's gradients, or zeros). Nothing is allocated for
gradients after the first step; the arenas' bytes are reported apart from the model states, as buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from zerotrain.runtime.zero.buckets import BucketPool
    from zerotrain.runtime.zero.collectives import Pending
    from zerotrain.runtime.zero.partition import UnitLayout
    from zerotrain.runtime.zero.streams import SideWork
    from zerotrain.runtime.zero.unit import Unit


class GradArenas:
    """The arenas, and which unit holds which."""

    def __init__(
        self,
        layouts: list[UnitLayout],
        dtype: torch.dtype,
        device: torch.device,
        pool: BucketPool,
        limit: int,
        depth: int = 2,
    ) -> None:
        self.dtype, self.device, self.pool, self.limit = dtype, device, pool, limit
        served = [la for la in layouts if la.padded <= limit]
        self.block_elements = max((la.padded for la in served if la.module is not None), default=0)
        root = next((la for la in served if la.module is None), None)
        self._root = torch.zeros(root.padded, dtype=dtype, device=device) if root is not None else None
        self._every: list[torch.Tensor] = []
        self._free: list[tuple[torch.Tensor, SideWork[Pending] | None]] = (
            [(self._new(), None) for _ in range(depth)] if self.block_elements else []
        )

    def serves(self, layout: UnitLayout) -> bool:
        """Whether a unit's gradients land in an arena: at most `limit` (reduceBucketElements) elements, so what
        the arenas keep for the whole run is bounded by the configuration, not by the model (read once, when the
        unit chooses its paths: `unit_paths`)."""
        return layout.padded <= self.limit and not layout.frozen

    def _new(self) -> torch.Tensor:
        arena = torch.zeros(self.block_elements, dtype=self.dtype, device=self.device)
        self._every.append(arena)
        return arena

    @property
    def nbytes(self) -> int:
        held = [*self._every, *([self._root] if self._root is not None else [])]
        return sum(t.numel() * t.element_size() for t in held)

    def bind(self, u: Unit) -> None:
        """Point the unit's trainable parameters' `.grad` at a zeroed arena (once per backward; never for a unit the
        arenas do not serve, whose gradients stay autograd's)."""
        if u.arena is not None or not self.serves(u.layout):
            return
        if u.layout.module is None:
            assert self._root is not None
            base = self._root
        else:
            while not self._free and self.pool.inflight:
                self.pool.finish_oldest()  # a reduction still reading an arena: let it finish
            if not self._free:
                self._free.append((self._new(), None))
            # The arena given back longest ago: the one just given back may still be read by its copy (FIFO lets
            # that copy overlap this unit's backward instead of stalling on it).
            base, still_read = self._free.pop(0)
            if still_read is not None:
                self.pool.streams.wait(still_read)  # the last copy out of this arena has run
        arena = base[: u.layout.padded]
        arena.zero_()
        u.arena = arena
        for slot, p in zip(u.layout.slots, u.params, strict=True):
            if p.requires_grad:
                p.grad = arena[slot.offset : slot.offset + slot.numel].view(slot.shape)

    def release(self, u: Unit, after: SideWork[Pending] | None = None) -> None:
        """Unbind the unit's `.grad` views and lend its arena again: at once when its reduction has read it, or
        (`after`) once that side work has run."""
        if u.arena is None:
            return
        base: Any = u.arena._base if u.arena._base is not None else u.arena
        if base is not self._root:
            self._free.append((base, after))
        u.arena = None
        for p in u.params:
            p.grad = None
