"""The order gradient reductions are issued in: the same on every rank, whatever autograd does.

Collectives are matched by issue order, so reductions cannot simply follow the order in which
units' gradients happen to complete: if that differs between ranks (a rank whose loss does not
reach some unit), gloo would pair different units' reductions. The schedule is fixed before
backward - units in reverse order of the forward just run (the order backward normally completes
them), then units that did not run, by index - and a unit is reduced once it and every unit before
it in the schedule are ready; the end of backward flushes the rest (in stage 3 first issuing the
gathers the unit's pre-backward would have issued, had it run). Normally that is exactly autograd's
order, so reductions still overlap backward; a rank whose backward skipped units issues the same
collectives at its end, and the divergence check, which comes after (at the step, or at the end of
backward with `divergenceCheck: every_pass`), names it.
"""

from __future__ import annotations

from collections.abc import Callable


class ReductionSchedule:
    """Issues `reduce(unit)` in schedule order as the `units` it schedules (those with gradients: a frozen unit has
    none) become ready."""

    def __init__(self, units: list[int], reduce: Callable[[int], None]) -> None:
        self.units, self.reduce = units, reduce
        self.order: list[int] = list(units)
        self.pos = 0
        self.ready: set[int] = set()

    def begin(self, forward_order: list[int]) -> None:
        """Fix the schedule for one backward from the units the forward ran, in order."""
        scheduled = set(self.units)
        seen: list[int] = []
        for i in reversed(forward_order):
            if i not in seen and i in scheduled:
                seen.append(i)
        self.order = seen + [i for i in self.units if i not in seen]
        self.pos, self.ready = 0, set()

    def mark_ready(self, unit: int) -> None:
        self.ready.add(unit)
        self._flush(force=False)

    def finish(self, before: Callable[[int], None] | None = None) -> None:
        """Reduce every unit not reduced yet, in schedule order, calling `before(unit)` first for those
        autograd never marked ready (stage 3 replays their pre-backward gathers there)."""
        self._flush(force=True, before=before)

    def _flush(self, force: bool, before: Callable[[int], None] | None = None) -> None:
        while self.pos < len(self.order) and (force or self.order[self.pos] in self.ready):
            unit = self.order[self.pos]
            self.pos += 1
            if before is not None and unit not in self.ready:
                before(unit)
            self.reduce(unit)


def gather_order(roots: list[int], forward_order: list[int], n_units: int) -> list[int]:
    """Units in the order the next forward needs them after a step: the root units, then the last forward's order,
    then the rest."""
    seen = list(dict.fromkeys(roots + forward_order))
    first = set(seen)
    return seen + [i for i in range(n_units) if i not in first]
