"""The operator's own periodic pass: every job the watch has shown, none it saw deleted, one failure isolated."""

from __future__ import annotations

import threading

from zerotrain.operator.resync import Resync


def test_resync_reconciles_the_jobs_seen_and_survives_a_failure() -> None:
    calls: list[tuple[str, str]] = []

    def reconcile(ns: str, name: str) -> None:
        calls.append((ns, name))
        if name == "broken":
            raise RuntimeError("API down for this one")

    r = Resync(60, reconcile)
    for key in [("a", "one"), ("a", "broken"), ("b", "two"), ("a", "gone")]:
        r.seen(key, present=True)
    r.seen(("a", "gone"), present=False)
    r.run_once()
    assert sorted(calls) == [("a", "broken"), ("a", "one"), ("b", "two")]


def test_resync_thread_runs_every_interval_and_stops() -> None:
    ticks = threading.Semaphore(0)
    r = Resync(0.05, lambda ns, name: ticks.release())
    r.seen(("ns", "job"), present=True)
    r.start()
    try:
        assert all(ticks.acquire(timeout=5) for _ in range(3))
    finally:
        r.stop()
    assert r._thread is not None and not r._thread.is_alive()
