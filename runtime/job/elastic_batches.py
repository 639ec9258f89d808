"""A rank's micro-batches in a gang of another size than the manifest's (`zerotrain.elastic.Layout`).

The entry point builds its task for the manifest's layout; this draws this rank's slots of each step from the
task's global micro-batches instead of the task's own iterator, so a step trains on the manifest's rows at any
size the operator runs the gang at.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from zerotrain.elastic import Layout
from zerotrain.runtime.job.task import ConfigError


@runtime_checkable
class GlobalBatches(Protocol):
    """Batches that can hand out any rows of any global micro-batch (`runtime.job.data.TextBatches` does)."""

    batch_size: int
    """Rows of one global micro-batch (all of the manifest's ranks together)."""

    def global_batch(self, index: int, rows: slice = ...) -> Any:
        """Rows `rows` of global micro-batch `index`."""
        ...


class SlotBatches:
    """Iterating yields rank `rank`'s micro-batches of steps 0, 1, … in `layout`."""

    def __init__(self, source: object, layout: Layout, rank: int) -> None:
        if not isinstance(source, GlobalBatches):
            raise ConfigError(
                f"spec.elastic: the gang runs at {layout.world} ranks, not the manifest's {layout.reference_world}, "
                f"but the entry point's batches ({type(source).__name__}) cannot hand out rows of a global "
                "micro-batch; return batches with batch_size and global_batch(index, rows) "
                "(zerotrain.runtime.job.data.TextBatches), or drop spec.elastic"
            )
        self.source, self.layout, self.rank = source, layout, rank
        self.rows = source.batch_size // layout.reference_world
        self.index = 0
        """This rank's micro-batches drawn so far (steps × the layout's accumulation)."""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        step, micro = divmod(self.index, self.layout.accumulation)
        batch, share = self.layout.slot(step, micro, self.rank)
        self.index += 1
        return self.source.global_batch(batch, slice(share * self.rows, (share + 1) * self.rows))

    def state_dict(self) -> dict[str, int]:
        return {"micro_batches": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at this rank's micro-batch `state["micro_batches"]` of the current layout."""
        self.index = int(state["micro_batches"])
