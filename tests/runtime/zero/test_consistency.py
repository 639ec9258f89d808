"""The order check's arithmetic: a fingerprint that tells orders apart, and, given every rank's counts, the rank and
unit that differ (the collectives themselves run in tests/runtime/zero/test_divergence.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zerotrain.runtime.zero.consistency import Event, OrderCheck

NAMES = ["root", "blocks.0", "blocks.1"]


@dataclass
class Ranks:
    """What OrderCheck reads of its communicator outside a collective."""

    world_size: int
    rank: int = 0


def check(world: int = 3) -> OrderCheck:
    return OrderCheck(Ranks(world), NAMES)  # type: ignore[arg-type]  # no collective is issued here


def test_the_fingerprint_tells_orders_and_counts_apart_and_reset_clears_it() -> None:
    a, b, c = check(), check(), check()
    for unit in (1, 2):
        a.note(Event.FORWARD, unit)
    for unit in (2, 1):
        b.note(Event.FORWARD, unit)
    c.note(Event.FORWARD, 1)
    assert a.hash != b.hash and a.hash != c.hash
    assert torch.equal(a.counts, b.counts)  # the same events, another order: only the hash differs
    assert int(a.counts[Event.FORWARD * 3 + 1]) == 1 and int(a.counts.sum()) == 2
    a.reset()
    assert a.hash == 0 and int(a.counts.sum()) == 0


def test_the_odd_rank_and_unit_are_named_from_every_rank_s_counts() -> None:
    table = torch.zeros(3, 2 * len(NAMES), dtype=torch.int64)
    table[:, Event.FORWARD * 3 + 2] = torch.tensor([1, 0, 1])  # rank 1 skipped blocks.1's forward
    error = check()._explain(table, "step")
    assert (error.rank, error.unit) == (1, "blocks.1")
    assert "forward events of this unit up to the step differ (rank 0: 1, rank 1: 0, rank 2: 1)" in str(error)
    tie = torch.zeros(2, 2 * len(NAMES), dtype=torch.int64)
    tie[:, Event.GRADS_READY * 3 + 0] = torch.tensor([1, 0])  # two ranks, one each: the one that ran less is odd
    error = check(2)._explain(tie, "backward")
    assert (error.rank, error.unit) == (1, "root") and "grads_ready events" in str(error)


def test_equal_counts_in_another_order_say_so() -> None:
    error = check()._explain(torch.ones(3, 2 * len(NAMES), dtype=torch.int64), "forward")
    assert error.unit == "?" and "same units but in different orders up to the forward" in str(error)
