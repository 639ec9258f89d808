"""The reduction schedule: reductions go out in one order on every rank, reverse forward order first, then the
units the forward did not run, and a unit only once every unit before it is ready."""

from __future__ import annotations

from zerotrain.runtime.zero.schedule import ReductionSchedule


def test_reductions_follow_the_reverse_forward_order_as_units_become_ready() -> None:
    issued: list[int] = []
    s = ReductionSchedule([0, 1, 2, 3], issued.append)
    s.begin([0, 1, 2, 3])
    s.mark_ready(2)  # ready before 3, which comes first: held
    assert issued == []
    s.mark_ready(3)
    assert issued == [3, 2]
    s.mark_ready(0)  # 1 still missing
    assert issued == [3, 2]
    s.mark_ready(1)
    assert issued == [3, 2, 1, 0]


def test_units_the_forward_skipped_come_last_and_finish_replays_their_gathers() -> None:
    issued: list[int] = []
    replayed: list[int] = []
    s = ReductionSchedule([0, 1, 2], issued.append)
    s.begin([0, 2, 2])  # unit 1 did not run; unit 2 ran twice
    assert s.order == [2, 0, 1]
    s.mark_ready(2)
    s.mark_ready(0)
    s.finish(before=replayed.append)
    assert issued == [2, 0, 1] and replayed == [1]  # only the unit autograd never marked ready


def test_only_scheduled_units_are_reduced_and_begin_starts_afresh() -> None:
    issued: list[int] = []
    s = ReductionSchedule([1, 3], issued.append)  # units 0 and 2 are frozen: no gradients
    s.begin([0, 1, 2, 3])
    assert s.order == [3, 1]
    s.finish()
    assert issued == [3, 1]
    s.begin([0, 1, 2, 3])
    s.mark_ready(3)
    assert issued == [3, 1, 3] and s.pos == 1
