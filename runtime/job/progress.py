"""Rank 0's progress: JSON lines for `zerotrain run` (or the pod log) and reports into the job's status."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from zerotrain.pod_contract import JOB_NAME_ENV

if TYPE_CHECKING:
    from zerotrain.runtime.job.gang_clock import Timekeeper
    from zerotrain.runtime.job.stragglers import Straggler


MAX_REPORTED = 64
"""Stragglers a report carries at most (status.stragglers' bound), in rank order."""


class StepReporter:
    """Rank 0's latest step into the job's status (`runtime.status_report`), off the training thread.

    At most one report every `interval_s` and one in flight; the last step is always sent. Outside a job
    (ZEROTRAIN_JOB_NAME unset, as in `zerotrain run`) report_progress does nothing.
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = -math.inf
        self._thread: threading.Thread | None = None
        self.clock: Timekeeper | None = None
        """The gang's clock, whose reading every report carries (status.gangClock)."""
        # Outside a job nothing is reported; inside one the client (kubernetes) is imported now, while the rank
        # starts, not inside the first step, where its half second would read as rank 0 straggling.
        self.enabled = bool(os.environ.get(JOB_NAME_ENV))
        if self.enabled:
            import zerotrain.runtime.job.status_report  # noqa: F401

    def report(
        self,
        step: int,
        final: bool = False,
        checkpoint: tuple[int, str] | None = None,
        evaluation: tuple[int, float] | None = None,
        stragglers: list[dict[str, object]] | None = None,
    ) -> None:
        """Send `step` (and a newly committed checkpoint, a new evaluation or a new straggler verdict, none ever
        throttled away)."""
        if not self.enabled:
            return
        from zerotrain.runtime.job.status_report import Progress, report_progress

        busy = self._thread is not None and self._thread.is_alive()
        news = checkpoint is not None or evaluation is not None or stragglers is not None
        if not final and not news and (busy or time.monotonic() - self._last < self.interval_s):
            return
        self.close()
        self._last = time.monotonic()
        clock = self.clock.reading().to_wire() if self.clock is not None else None
        progress = Progress(step, checkpoint, evaluation, stragglers, clock)
        self._thread = threading.Thread(target=report_progress, args=(progress,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=10)


class ProgressSink(Protocol):
    """Where a rank says how its run goes: rank 0's `ProgressLog`, every other rank's `NoProgress`."""

    def write(self, record: dict[str, Any]) -> None: ...
    def checkpoint(self, step: int, path: str) -> None: ...
    def evaluation(self, step: int, loss: float, seconds: float) -> None: ...
    def resumed(self, step: int, path: str) -> None: ...
    def note(self, text: str) -> None: ...
    def stragglers(self, step: int, named: list[Straggler]) -> None: ...
    def follow(self, clock: Timekeeper) -> None: ...
    def stopped(self, step: int, saved: str | None, cause: str) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    """The progress of a rank that reports none (every rank but 0): each record is dropped."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def checkpoint(self, step: int, path: str) -> None:
        pass

    def evaluation(self, step: int, loss: float, seconds: float) -> None:
        pass

    def resumed(self, step: int, path: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def stragglers(self, step: int, named: list[Straggler]) -> None:
        pass

    def follow(self, clock: Timekeeper) -> None:
        pass

    def stopped(self, step: int, saved: str | None, cause: str) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressLog:
    """Rank 0's JSON-lines progress, flushed per line so a reader can tail it; steps also go to the job status."""

    def __init__(self, path: str | None, reporter: StepReporter | None = None) -> None:
        self._out: TextIO = open(path, "a", buffering=1) if path else sys.stdout  # noqa: SIM115
        self._reporter = reporter or StepReporter()

    def write(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()
        self._reporter.report(record["step"], final=record["step"] == record["steps"])

    def checkpoint(self, step: int, path: str) -> None:
        self._out.write(json.dumps({"checkpoint": path, "checkpoint_step": step}) + "\n")
        self._out.flush()
        self._reporter.report(step, checkpoint=(step, path))

    def evaluation(self, step: int, loss: float, seconds: float) -> None:
        """The evaluation after `step` (`zerotrain run` shows it; the job's status keeps the last one)."""
        self._out.write(json.dumps({"eval_step": step, "eval_loss": loss, "eval_s": seconds}) + "\n")
        self._out.flush()
        self._reporter.report(step, evaluation=(step, loss))

    def resumed(self, step: int, path: str) -> None:
        """The run continues from checkpoint `path` after `step` (`zerotrain run` says so)."""
        self._out.write(json.dumps({"resumed": path, "resumed_step": step}) + "\n")
        self._out.flush()

    def note(self, text: str) -> None:
        """One line about how the run starts (how the model was built, where its weights came from)."""
        self._out.write(json.dumps({"note": text}) + "\n")
        self._out.flush()

    def stragglers(self, step: int, named: list[Straggler]) -> None:
        """A new verdict at the end of the window ending at `step`: the ranks that hold the gang back, or none
        (cleared). `zerotrain run` prints it; the job's status keeps it."""
        record = {"stragglers": [s.message() for s in named], "stragglers_step": step}
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()
        self._reporter.report(step, stragglers=[s.status(step) for s in named[:MAX_REPORTED]])

    def follow(self, clock: Timekeeper) -> None:
        """Every report into the job's status from now on carries a reading of `clock`."""
        self._reporter.clock = clock

    def stopped(self, step: int, saved: str | None, cause: str) -> None:
        """Every rank stopped after `step` on `cause` (a signal's name), having committed `saved` if not None."""
        self._out.write(json.dumps({"stopped": step, "saved": saved, "cause": cause}) + "\n")
        self._out.flush()

    def close(self) -> None:
        self._reporter.close()
        if self._out is not sys.stdout:
            self._out.close()


def throughput(tokens: int, samples: int, steps: int, seconds: float) -> dict[str, Any]:
    """Throughput in the task's own unit: tokens/s when it reports tokens, else samples/s, else steps/s."""
    amount, unit = (tokens, "tokens/s") if tokens else (samples, "samples/s") if samples else (steps, "steps/s")
    return {"throughput": amount / seconds if seconds > 0 else 0.0, "throughput_unit": unit}
