"""Rank 0's gang clock: training is what the steps leave after evaluation and blocked saves; the uncommitted
training restarts at a checkpoint's step, whether it commits within that step or steps later."""

from __future__ import annotations

import os

from zerotrain.goodput import GoodputSeconds
from zerotrain.runtime.job.gang_clock import Timekeeper, launcher_start, process_start
from zerotrain.runtime.job.step_split import Phase, StepSplit


def split(checkpoint: float = 0.0, evaluation: float = 0.0) -> StepSplit:
    seconds = dict.fromkeys(Phase, 0.0) | {Phase.CHECKPOINT: checkpoint, Phase.EVALUATION: evaluation}
    return StepSplit(seconds, sum(seconds.values()))


def test_a_synchronous_save_commits_within_its_step_and_an_asynchronous_one_steps_later() -> None:
    clock = Timekeeper(started=100.0)
    clock.begin(now=110.0)  # ten seconds of starting
    for step in (1, 2):
        clock.end(step, split(), now=110.0 + step)
    clock.committed(3, now=113.5)  # a synchronous save of step 3, before step 3 ends
    assert clock.reading(now=113.5).uncommitted_seconds == 0
    clock.end(3, split(checkpoint=0.5), now=114.0)  # the save blocked half a second
    assert clock.reading(now=114.0).uncommitted_seconds == 0
    for step in (4, 5):
        clock.end(step, split(), now=110.0 + step)
    clock.committed(4)  # an asynchronous save of step 4 commits after step 5
    reading = clock.reading(now=115.0)
    assert reading.uncommitted_seconds == 1.0 and reading.checkpointing_seconds == 0.5
    clock.end(6, split(evaluation=2.0), now=118.0)
    reading = clock.reading(now=118.0)
    assert (reading.uncommitted_seconds, reading.training_seconds()) == (2.0, 5.5)
    assert clock.split(now=118.0) == GoodputSeconds(starting=10, training=5.5, evaluating=2, checkpointing=0.5)


def test_the_launcher_start_is_read_from_proc() -> None:
    mine = process_start(os.getpid())
    assert mine is not None and abs(mine - launcher_start()) < 1.0  # no ZEROTRAIN_LAUNCHER_PID: this process
    assert process_start(2**22 + 1) is None  # no such process
