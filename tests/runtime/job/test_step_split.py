"""A rank's step split by phase: timed phases around their calls, collectives from the engine's counter (those run
inside a timed phase are that phase's), compute the rest; the phases sum to the step's wall time."""

from __future__ import annotations

import pytest

from zerotrain.runtime.job.step_split import Phase, StepClock


class Fake:
    """A clock and a collective counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.collective = 0.0

    def tick(self, seconds: float, collective: float = 0.0) -> None:
        self.now += seconds
        self.collective += collective

    def begun(self) -> StepClock:
        """A step clock on this fake, its first step begun."""
        clock = StepClock(lambda: self.collective, lambda: self.now)
        clock.begin()
        return clock


def test_each_phase_gets_its_own_time_and_compute_the_rest() -> None:
    f = Fake()
    clock = f.begun()
    with clock.timing(Phase.DATA_WAIT):
        f.tick(0.2)
    f.tick(0.5, collective=0.3)  # forward and backward, 0.3 s of it blocked in collectives
    with clock.timing(Phase.CHECKPOINT):
        f.tick(0.4, collective=0.1)  # the save's own barrier is the save's
    with clock.timing(Phase.EVALUATION):
        f.tick(0.3, collective=0.05)
    split = clock.end()
    assert split.wall == pytest.approx(1.4)
    want = {
        Phase.DATA_WAIT: 0.2,
        Phase.COLLECTIVE_WAIT: 0.3,
        Phase.COMPUTE: 0.2,
        Phase.CHECKPOINT: 0.4,
        Phase.EVALUATION: 0.3,
    }
    assert split.seconds == pytest.approx(want)
    assert sum(split.seconds.values()) == pytest.approx(split.wall)


def test_a_second_step_starts_from_nothing_and_no_phase_goes_negative() -> None:
    f = Fake()
    clock = f.begun()
    with clock.timing(Phase.DATA_WAIT):
        f.tick(1.0)
    clock.end()
    clock.begin()
    f.tick(0.1, collective=0.2)  # a counter ahead of the clock (read at another moment): capped at the step
    split = clock.end()
    assert split[Phase.DATA_WAIT] == 0.0 and split[Phase.COLLECTIVE_WAIT] == pytest.approx(0.1)
    assert split[Phase.COMPUTE] == 0.0 and all(v >= 0 for v in split.seconds.values())


def test_only_the_phases_around_a_call_can_be_timed() -> None:
    clock = StepClock(lambda: 0.0)
    clock.begin()
    with pytest.raises(AssertionError, match="not timed around a call"), clock.timing(Phase.COMPUTE):
        pass
