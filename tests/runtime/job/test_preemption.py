"""The SIGTERM budget: the watchdog ends a rank that has not committed in time, and only then."""

from __future__ import annotations

import os
import signal
import threading
import time

from zerotrain.runtime.job.preemption import Preempted, Preemption


def test_sigterm_is_noted_not_acted_on_and_the_budget_ends_a_rank_that_misses_it() -> None:
    spent: list[str] = []
    fired = threading.Event()
    p = Preemption(0.2, lambda message: (spent.append(message), fired.set()))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        p.install()
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the process lives on
        deadline = time.monotonic() + 5
        while not p.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.requested
        first = p.requested_at
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal does not restart the budget
        time.sleep(0.05)
        assert p.requested_at == first
        assert fired.wait(5)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "no checkpoint committed within spec.checkpoint.terminationBudgetSeconds=0.2" in spent[0]


def test_a_rank_that_committed_in_time_is_not_ended() -> None:
    spent: list[str] = []
    p = Preemption(0.2, spent.append)
    p.request()
    p.done()
    time.sleep(0.4)
    assert spent == []
    assert "stopped after step 7, checkpoint /c/step-7 committed 1.5 s after" in str(Preempted(7, "/c/step-7", 1.5))


def test_sigterm_starts_the_budget_while_the_main_thread_is_held_in_c() -> None:
    # A rank waiting in a device-to-host copy on a collective whose peer is gone runs no Python signal handler; one
    # long C call stands in for it here (torch releases the GIL in it, as it does in a copy or a NCCL wait).
    import torch

    p = Preemption(30.0, lambda message: None)
    previous, previous_fd = signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
    try:
        p.install()
        a = torch.full((1500, 1500), 1 / 1500, dtype=torch.float64)  # its square is itself: no overflow
        start = time.monotonic()
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        torch.linalg.matrix_power(a, 2**20)  # 20 products in one C call (about a second here)
        returned = time.monotonic()
        assert p.requested_at is not None
        assert p.requested_at - start < (returned - start) / 2, (p.requested_at - start, returned - start)
    finally:
        p.done()
        signal.signal(signal.SIGTERM, previous)
        signal.set_wakeup_fd(previous_fd)
