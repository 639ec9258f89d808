"""The rule that names a straggler: its data wait or compute per step against the median of the *other* ranks,
above the threshold and above a floor of the step time; one cause per rank, the costlier."""

from __future__ import annotations

import pytest
import torch

from zerotrain.job_status import StragglerCause
from zerotrain.runtime.job.step_split import Phase, StepSplit
from zerotrain.runtime.job.stragglers import RankWindow, StragglerWatch, find_stragglers


def w(data: float, compute: float, wall: float = 1.0) -> RankWindow:
    return RankWindow(data, compute, wall)


def test_two_ranks_one_slower_in_its_data_is_named_with_cause_input() -> None:
    # With two ranks the median of all would be the mean (1.2× for a rank 1.5× slower): the others' median is 1.5×.
    (found,) = find_stragglers([w(0.2, 0.5), w(0.3, 0.5)], threshold=1.3, window=10)
    assert (found.rank, found.cause) == (1, StragglerCause.INPUT)
    assert found.ratio == pytest.approx(1.5) and found.others_per_step == 0.2
    assert "rank 1 holds the gang back (input): data wait 0.300 s/step" in found.message()
    assert "the other ranks' 0.200 s/step (1.50×), medians of the last 10 steps" in found.message()


def test_a_rank_slower_in_compute_is_named_with_cause_compute_and_the_waiting_ranks_are_not() -> None:
    table = [w(0.01, 0.4), w(0.01, 0.4), w(0.01, 0.7), w(0.01, 0.4)]
    (found,) = find_stragglers(table, threshold=1.3, window=10)
    assert (found.rank, found.cause) == (2, StragglerCause.COMPUTE)


def test_noise_in_a_phase_that_takes_nearly_nothing_names_no_one() -> None:
    # Data waits of 1 ms and 3 ms: three times as long, but 0.2% of a step.
    assert find_stragglers([w(0.001, 0.5), w(0.003, 0.5)], threshold=1.3, window=10) == []


def test_within_the_threshold_names_no_one_and_one_rank_has_no_peers() -> None:
    assert find_stragglers([w(0.2, 0.5), w(0.2, 0.6)], threshold=1.3, window=10) == []
    assert find_stragglers([w(5.0, 5.0)], threshold=1.3, window=10) == []


def test_slow_on_both_counts_the_costlier_cause_is_named() -> None:
    (found,) = find_stragglers([w(0.2, 0.4), w(0.3, 0.9)], threshold=1.3, window=10)
    assert found.cause is StragglerCause.COMPUTE


def test_every_rank_slow_at_once_names_no_one() -> None:
    assert find_stragglers([w(0.6, 0.9)] * 4, threshold=1.3, window=10) == []


class TwoRanks:
    """Rank 0's side of a 2-rank all-reduce whose other row is given: what the watch sees of the gang."""

    rank, world_size = 0, 2

    def __init__(self) -> None:
        self.other = (0.0, 0.0, 0.0)

    def all_reduce(self, t: torch.Tensor, unit: str, label: str = "") -> None:
        t[1] += torch.tensor(self.other, dtype=t.dtype)


def test_a_rank_is_named_after_two_windows_in_a_row_and_cleared_after_two_that_differ() -> None:
    comm = TwoRanks()
    watch = StragglerWatch(comm, torch.device("cpu"), threshold=1.3, window=2)  # type: ignore[arg-type]
    step = StepSplit(dict.fromkeys(Phase, 0.0) | {Phase.DATA_WAIT: 0.2, Phase.COMPUTE: 0.5}, 1.0)
    slow, level = (0.4, 0.5, 1.0), (0.2, 0.5, 1.0)
    named = [(1, StragglerCause.INPUT)]
    verdicts = []
    # rank 1's median step each window: twice rank 0's data wait, or level with it.
    for other in [slow, level, slow, slow, level, slow, level, level, slow]:
        comm.other = other
        assert watch.observe(step) is None  # mid-window: nothing exchanged
        verdicts.append([(s.rank, s.cause) for s in watch.observe(step) or []])
    # One slow window names no one, nor do two apart; two in a row name rank 1; one level window between slow ones
    # keeps it named (the moment, not the rank); two level windows in a row clear it.
    assert verdicts == [[], [], [], named, named, named, named, [], []]
