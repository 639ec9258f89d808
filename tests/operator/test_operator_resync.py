"""The operator's own periodic pass: every job the watch has shown, none it saw deleted, one failure isolated."""

from __future__ import annotations

import threading

from zerotrain.operator.client.resync import Resync


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


def test_the_listing_adds_jobs_the_watch_never_showed_and_drops_those_gone_unseen() -> None:
    calls: list[tuple[str, str]] = []
    lists: list[int] = []

    def lister() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        lists.append(1)
        return [("a", "missed-by-the-watch"), ("a", "seen")], [("a", "deleted-in-a-watch-gap")]

    r = Resync(60, lambda ns, name: calls.append((ns, name)), lister=lister, relist_seconds=3600)
    r.seen(("a", "seen"), present=True)
    r.seen(("a", "deleted-in-a-watch-gap"), present=True)
    r.run_once()
    assert sorted(calls) == [("a", "missed-by-the-watch"), ("a", "seen")]
    r.run_once()  # within relist_seconds: the round lists nothing
    assert len(lists) == 1
    r.relist_seconds = 0
    r.run_once()
    assert len(lists) == 2


def test_a_failed_listing_does_not_stop_the_round() -> None:
    def broken() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        raise RuntimeError("503")

    calls: list[tuple[str, str]] = []
    r = Resync(60, lambda ns, name: calls.append((ns, name)), lister=broken)
    r.seen(("a", "seen"), present=True)
    r.run_once()
    assert calls == [("a", "seen")]


def test_the_first_listing_comes_at_start_not_after_an_interval() -> None:
    listed = threading.Event()

    def lister() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        listed.set()
        return [], []

    r = Resync(3600, lambda ns, name: None, lister=lister)
    r.start()
    try:
        assert listed.wait(5)
    finally:
        r.stop()
