"""The operator's own periodic resync: every job the cache holds is added to the work queue, and every
`relist_seconds` the round starts with a LIST of the jobs."""

from __future__ import annotations

import threading

from budget import budget

from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.kube import Listing
from zerotrain.operator.client.resync import Resync


def job(name: str, rv: str) -> dict[str, object]:
    return {"metadata": {"namespace": "a", "name": name, "resourceVersion": rv}}


def test_resync_asks_for_the_jobs_the_cache_holds_and_not_those_gone() -> None:
    cache = ObjectCache()
    for name in ["one", "two", "gone"]:
        cache.put_job(job(name, "1"))
    cache.drop_job(job("gone", "2"))
    calls: list[tuple[str, str]] = []
    Resync(60, calls.append, cache.job_keys).run_once()
    assert calls == [("a", "one"), ("a", "two")]


def test_resync_thread_runs_every_interval_and_stops() -> None:
    ticks = threading.Semaphore(0)
    r = Resync(0.05, lambda key: ticks.release(), lambda: [("ns", "job")])
    r.start()
    try:
        assert all(ticks.acquire(timeout=budget(5)) for _ in range(3))
    finally:
        r.stop()
    assert r._thread is not None and not r._thread.is_alive()


def test_the_listing_adds_jobs_the_watch_never_showed_and_drops_those_gone_unseen() -> None:
    cache = ObjectCache()
    cache.put_job(job("seen", "1"))
    cache.put_job(job("deleted-in-a-watch-gap", "2"))
    lists: list[int] = []

    def lister() -> None:
        lists.append(1)
        cache.relisted_jobs("a", Listing([job("missed-by-the-watch", "3"), job("seen", "1")], "10"))

    calls: list[tuple[str, str]] = []
    r = Resync(60, calls.append, cache.job_keys, lister=lister, relist_seconds=3600)
    r.run_once()  # kopf has just listed the jobs: the first LIST is one period away
    assert lists == [] and calls == [("a", "deleted-in-a-watch-gap"), ("a", "seen")]
    r.relist_seconds = 0
    calls.clear()
    r.run_once()
    assert len(lists) == 1 and calls == [("a", "missed-by-the-watch"), ("a", "seen")]


def test_a_failed_listing_does_not_stop_the_round() -> None:
    def broken() -> None:
        raise RuntimeError("503")

    calls: list[tuple[str, str]] = []
    Resync(60, calls.append, lambda: [("a", "seen")], lister=broken, relist_seconds=0).run_once()
    assert calls == [("a", "seen")]
