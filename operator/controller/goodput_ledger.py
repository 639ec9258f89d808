"""status.goodput from one pass's decision (pure): the running gang's newest clock folded in, or the gang closed
when this pass ended it (restart, suspension, the job's end). `zerotrain.goodput` holds the arithmetic."""

from __future__ import annotations

from datetime import datetime, timedelta

from zerotrain import goodput
from zerotrain.goodput import Bucket, Ending, GangEnd
from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.operator.controller.conditions import Reason
from zerotrain.operator.controller.observe import Disruption

TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)
# Restart causes that give the ranks no SIGTERM to commit their step on: what they trained since the newest
# checkpoint is lost. Every other cause (preemption, eviction, a deleted pod, a resize) stops them gracefully.
LOSSY = frozenset({"Failed", Reason.OUT_OF_MEMORY, Disruption.NODE_LOST.value})


def died_at(finished: datetime | None) -> datetime | None:
    """A container's death from its finishedAt. The API keeps whole seconds, so a whole-second time stands for the
    middle of its second: half a second off at most, where the truncated value is up to a whole second early."""
    if finished is None or finished.microsecond:
        return finished
    return finished + timedelta(seconds=0.5)


def gang_end(
    was: Phase, st: ZeroTrainingJobStatus, restart_cause: str | None, died: datetime | None, now: datetime
) -> GangEnd | None:
    """How this pass ended the running gang, if it did."""
    if restart_cause is not None:
        ending = Ending.FAILED if restart_cause in LOSSY else Ending.STOPPED
        return GangEnd(ending, now, died_at(died) if ending == Ending.FAILED else None, Bucket.RESTARTING)
    if st.phase == Phase.SUCCEEDED:
        return GangEnd(Ending.SUCCEEDED, now, None, None)
    if st.phase == Phase.FAILED:
        return GangEnd(Ending.FAILED, now, died_at(died), None)
    if st.phase == Phase.SUSPENDED and was != Phase.SUSPENDED:
        return GangEnd(Ending.STOPPED, now, None, Bucket.PENDING)
    return None


def keep(
    previous: ZeroTrainingJobStatus | None,
    st: ZeroTrainingJobStatus,
    restart_cause: str | None,
    died: datetime | None,
    created: datetime | None,
    now: datetime,
) -> None:
    """Set st.goodput: the previous ledger (or a new one from the job's creation) moved on by this pass."""
    ledger = (previous.goodput if previous is not None else None) or goodput.start(created or now)
    was = previous.phase if previous is not None else Phase.PENDING
    if was in TERMINAL and st.phase in TERMINAL:
        st.goodput = ledger
        return
    end = gang_end(was, st, restart_cause, died, now)
    gang = previous.restarts.total if previous is not None else 0  # the gang that ran until this pass
    clock = st.gang_clock
    st.goodput = goodput.close(ledger, clock, end, gang) if end else goodput.account(ledger, clock, gang)
