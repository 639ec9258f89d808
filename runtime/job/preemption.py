"""SIGTERM (and SIGINT, Ctrl-C) as a request to checkpoint and stop, within a time budget, the same way on every rank.

Kubernetes sends SIGTERM before it evicts, preempts or deletes a pod; the launcher forwards it to every rank, and
forwards SIGINT the same way (`zerotrain run` on Ctrl-C; a launcher started from a terminal). A
rank only notes it here (a signal handler must not run collectives). The training loop passes the note as a vote
to the step's control all-reduce that runs anyway, so all ranks learn of it after the same step, even those whose
pod was not signalled, with no extra collective; then each finishes that step, commits a checkpoint and exits
with EXIT_PREEMPTED.

The budget runs from the signal. A watchdog ends the rank when it is spent: the commit marker is written last and
renamed into place atomically, so an exit at any moment leaves either a committed checkpoint or none, never a
partial one, and the previous checkpoint stands.

Python runs a signal handler only in the main thread between bytecodes, and a rank's main thread can sit for minutes
in one C call: a device-to-host copy waiting on a collective whose peer is gone, until NCCL's watchdog fires. So the
signal is also taken through the interpreter's wakeup file descriptor, which its C-level handler writes at once
from any thread, and a small thread reading it starts the budget: a rank stuck that way still ends within it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from zerotrain.pod_contract import LAUNCHER_PID_ENV, RANK_PARENT_PID_ENV

# 128 + SIGTERM, as a shell reports a process stopped by it; the launcher reads it as "saved and stopped".
EXIT_PREEMPTED = 128 + int(signal.SIGTERM)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PEER_REQUEST = "a stop signal to another rank"


class Preempted(Exception):
    """Every rank agreed to stop after `step` on a stop signal (`cause`: its name, or PEER_REQUEST for a rank that got
    none itself); `saved` is the checkpoint committed then, if any."""

    def __init__(self, step: int, saved: str | None, seconds: float, cause: str = "SIGTERM") -> None:
        where = f"checkpoint {saved} committed" if saved else "no checkpoint directory, nothing saved"
        super().__init__(f"{cause}; every rank stopped after step {step}, {where} {seconds:.1f} s after the signal")
        self.step, self.saved, self.cause = step, saved, cause


class StopRequests(Protocol):
    """What the training loop asks about a stop: `Preemption`, or `NoPreemption` where no signal is taken."""

    @property
    def requested(self) -> bool: ...

    @property
    def cause(self) -> str: ...

    def elapsed(self) -> float: ...


class NoPreemption:
    """No signal is taken on this rank: it stops only on another rank's vote."""

    requested = False
    cause = PEER_REQUEST

    def elapsed(self) -> float:
        return 0.0


class Preemption:
    """Notes SIGTERM and enforces the budget; `requested` is what the loop shares with the other ranks."""

    def __init__(self, budget_s: float, on_budget_spent: Callable[[str], None]) -> None:
        self.budget_s = budget_s
        self.requested_at: float | None = None
        self.cause = PEER_REQUEST
        self._on_budget_spent = on_budget_spent
        self._watchdog: threading.Timer | None = None
        self._lock = threading.Lock()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        """Take SIGTERM and SIGINT (call in the main thread, before training): noted by the handler, and by a thread
        reading the wakeup descriptor when the main thread is held in C."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)  # kept: closing either would end the thread or the notes
        threading.Thread(target=self._read_wakeups, args=(reader,), name="zerotrain-sigterm", daemon=True).start()

    def _read_wakeups(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for sig in STOP_SIGNALS:
                if int(sig) in data:
                    self.request(sig.name)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request(signal.Signals(signum).name)

    def request(self, cause: str = "SIGTERM") -> None:
        """Start the budget (a second signal does not restart it)."""
        with self._lock:  # the handler and the wakeup thread may both get here
            if self.requested_at is not None:
                return
            self.requested_at = time.monotonic()
            self.cause = cause
            self._watchdog = threading.Timer(self.budget_s, self._spent)
            self._watchdog.daemon = True
            try:
                self._watchdog.start()
            except RuntimeError:  # "can't start new thread": out of memory; the main thread's failure says so
                self._watchdog = None

    def elapsed(self) -> float:
        return 0.0 if self.requested_at is None else time.monotonic() - self.requested_at

    def done(self) -> None:
        """The checkpoint committed (or there was none to write): the watchdog has nothing left to guard."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _spent(self) -> None:
        self._on_budget_spent(
            f"{self.cause}; no checkpoint committed within spec.checkpoint.terminationBudgetSeconds="
            f"{self.budget_s:g}; the previous checkpoint stands (raise the budget if saves take longer)"
        )


def exit_preempted(message: str) -> None:
    """The watchdog's end: no teardown (peers may be blocked in the save's collectives)."""
    from zerotrain.runtime.job.failures import FailureKind, write_failure_record

    print(f"zerotrain rank {os.environ.get('RANK', '?')}: {message}", file=sys.stderr, flush=True)
    write_failure_record(message, FailureKind.PREEMPTED)
    os._exit(EXIT_PREEMPTED)


PR_SET_PDEATHSIG = 1


def die_with_launcher(env: dict[str, str] | None = None) -> None:
    """Have Linux SIGKILL this rank when its launcher exits (a second Ctrl-C, a launcher killed outright).

    The elastic launcher starts each rank in a session of its own, so neither the terminal's signals nor the
    launcher's end would reach it: without this a rank whose launcher is gone trains on, an orphan holding its
    ports and memory. Killing it is safe for checkpoints: the commit marker is renamed into place last.
    """
    environ = os.environ if env is None else env
    launcher = environ.get(RANK_PARENT_PID_ENV) or environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(launcher):  # it exited before the request took hold
        os._exit(128 + int(signal.SIGKILL))
