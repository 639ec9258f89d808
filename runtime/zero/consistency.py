"""Detection of rank-divergent control flow (a rank that skips or adds a unit's forward or backward).

ZeRO's collectives are matched by issue order, so ranks that run different units would silently
exchange the wrong units' data (same-size units) or wait on each other forever (different sizes).
Each rank keeps a running hash of the unit events it saw - forward of a unit, a unit's gradients
completing during backward - and a count per unit and event. By default (`divergenceCheck: step`) the hash
rides the optimizer step's control all-reduce (`control`), which runs anyway: no collective of its own, and a
divergence is caught before the optimizer applies anything. With `every_pass` the ranks also all-gather their
one-int64 hash at the end of every forward (before any gradient collective) and every backward that reduces:
8·N bytes each, counted as op `order_check`. On a mismatch they all-gather the counts (every rank now knows, so
the second collective is matched too) and raise `RankDivergenceError` naming the rank and unit that differ.
Stage-3 gathers follow a schedule (`hooks.Gatherer`), so a rank that skips a unit still issues the same gathers
until the check. Gradient reductions follow a schedule too (`schedule`), and a rank whose backward never reached
some units issues their gathers and reductions at its end, before the check: so a rank that skips a unit's
forward, or whose loss does not reach a unit, gets a `RankDivergenceError` on every rank instead of a hang.
Anything else that leaves a collective unmatched fails after `collectiveTimeoutSeconds`
(`CollectiveTimeoutError`, naming the unit); gloo itself aborts the process when mismatched collectives of
different sizes meet.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from zerotrain.runtime.zero.collectives import Comm, Pending
from zerotrain.runtime.zero.engine_errors import RankDivergenceError

_MOD = (1 << 61) - 1
CHECK_UNIT = "<order-check>"
CHECK_OP = "order_check"  # its own line in comm_report(), so unit traffic reads clean


class Event(IntEnum):
    """What happened to a unit."""

    FORWARD = 0
    GRADS_READY = 1


class OrderCheck:
    """Running per-rank fingerprint of unit events, compared across ranks at fixed points."""

    def __init__(self, comm: Comm, unit_names: list[str], device: torch.device | None = None) -> None:
        """`device`: where the check's tensors live, one the process group serves (the host, unless the group is
        NCCL alone); the counts are kept on the host and moved only when compared."""
        self.comm, self.names = comm, unit_names
        self.device = device or torch.device("cpu")
        self.counts = torch.zeros(len(Event) * len(unit_names), dtype=torch.int64)
        self.hash = 0

    def note(self, event: Event, unit: int) -> None:
        key = event * len(self.names) + unit
        self.counts[key] += 1
        self.hash = (self.hash * 1_000_003 + key + 1) % _MOD

    def verify(self, where: str) -> None:
        """All ranks compare their fingerprints since the last check; raise on any difference."""
        self.launch(where).finish()

    def launch(self, where: str) -> PendingCheck:
        """Start comparing the fingerprints since the last check without waiting; the next interval starts now."""
        mine = torch.tensor([self.hash], dtype=torch.int64, device=self.device)
        every = torch.empty(self.comm.world_size, dtype=torch.int64, device=self.device)
        work = self.comm.all_gather(every, mine, CHECK_UNIT, async_op=True, label=CHECK_OP)
        pending = PendingCheck(self, every, work, self.counts.clone(), where)
        self.reset()
        return pending

    def reset(self) -> None:
        """The ranks agreed up to here: start the next interval."""
        self.counts.zero_()
        self.hash = 0

    def explain(self, where: str, counts: torch.Tensor | None = None) -> RankDivergenceError:
        """Every rank saw a mismatch: all-gather the counts (matched on every rank) and name the odd rank and unit."""
        mine = (self.counts if counts is None else counts).to(self.device)
        table = torch.empty(self.comm.world_size * mine.numel(), dtype=torch.int64, device=self.device)
        self.comm.all_gather(table, mine, CHECK_UNIT, label=CHECK_OP)
        return self._explain(table.view(self.comm.world_size, -1).cpu(), where)

    def _explain(self, table: torch.Tensor, where: str) -> RankDivergenceError:
        n_units = len(self.names)
        for key in range(table.shape[1]):
            column = table[:, key]
            values, freq = column.unique(return_counts=True)
            if len(values) > 1:
                # The majority count is the expected one; on a tie, the higher (the rank that skipped is odd).
                usual = max(zip(freq.tolist(), values.tolist(), strict=True))[1]
                odd = int((column != usual).nonzero()[0])
                event, unit = Event(key // n_units), key % n_units
                ran = ", ".join(f"rank {r}: {int(c)}" for r, c in enumerate(column))
                return RankDivergenceError(
                    odd, self.names[unit], f"{event.name.lower()} events of this unit up to the {where} differ ({ran})"
                )
        return RankDivergenceError(
            self.comm.rank, "?", f"the ranks ran the same units but in different orders up to the {where}"
        )


class PendingCheck:
    """A fingerprint comparison in flight; `finish()` waits and raises on a difference."""

    def __init__(self, check: OrderCheck, every: torch.Tensor, work: Pending, counts: torch.Tensor, where: str):
        self.check, self.every, self.work, self.counts, self.where = check, every, work, counts, where

    def finish(self) -> None:
        self.work.wait()
        if not bool((self.every == self.every[0]).all()):
            raise self.check.explain(self.where, self.counts)


class PassChecks:
    """When the order check runs besides the step (which always checks): at the end of every forward and backward
    when `divergenceCheck: everyPass`, and at the end of every forward whenever stage 3 prefetches (its backward's
    gathers follow the forward's order, so a divergent forward must be caught before backward). None of it on one
    rank or with the check off."""

    def __init__(self, check: OrderCheck | None, every_pass: bool, prefetching: bool) -> None:
        self.check, self.every_pass = check, every_pass
        self._after_forward = every_pass or prefetching
        self._pending: PendingCheck | None = None

    def note(self, event: Event, unit: int) -> None:
        if self.check is not None:
            self.check.note(event, unit)

    def end_forward(self) -> None:
        """Launched, and waited for as backward starts: the loss computation in between hides its latency."""
        if self.check is not None and self._after_forward:
            self.finish_forward()  # a forward without backward (evaluation) left one in flight
            self._pending = self.check.launch("end of forward")

    def finish_forward(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()

    def end_backward(self, reduced: bool) -> None:
        """After a backward that reduced gradients (a rank whose backward skipped units still issued them all)."""
        if self.check is not None and self.every_pass and reduced:
            self.check.verify("end of backward")
