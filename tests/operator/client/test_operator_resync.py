"""The operator's own periodic resync: every job the watch has shown is added to the work queue, none it saw
deleted."""

from __future__ import annotations

import threading

from zerotrain.operator.client.resync import Resync


def test_resync_asks_for_the_jobs_seen_and_not_those_gone() -> None:
    calls: list[tuple[str, str]] = []
    r = Resync(60, calls.append)
    for key in [("a", "one"), ("a", "two"), ("b", "three"), ("a", "gone")]:
        r.seen(key, present=True)
    r.seen(("a", "gone"), present=False)
    r.run_once()
    assert sorted(calls) == [("a", "one"), ("a", "two"), ("b", "three")]


def test_resync_thread_runs_every_interval_and_stops() -> None:
    ticks = threading.Semaphore(0)
    r = Resync(0.05, lambda key: ticks.release())
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

    r = Resync(60, calls.append, lister=lister, relist_seconds=3600)
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
    r = Resync(60, calls.append, lister=broken)
    r.seen(("a", "seen"), present=True)
    r.run_once()
    assert calls == [("a", "seen")]


def test_the_first_listing_comes_at_start_not_after_an_interval() -> None:
    listed = threading.Event()

    def lister() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        listed.set()
        return [], []

    r = Resync(3600, lambda key: None, lister=lister)
    r.start()
    try:
        assert listed.wait(5)
    finally:
        r.stop()
