"""The shared pod-create workers: a small job's creates are not queued behind a big gang's, the total in flight
stays at the worker count, and a failure reaches the caller that queued it."""

from __future__ import annotations

import threading
import time

import pytest

from zerotrain.operator.client.fair_pool import FairPool


def test_a_small_job_is_served_in_turn_with_a_big_gang() -> None:
    pool = FairPool(workers=1)
    order: list[str] = []
    started, go = threading.Event(), threading.Event()

    def create(name: str) -> str:
        if name == "big-0":
            started.set()
            go.wait(5)
        order.append(name)
        return name

    big = threading.Thread(target=pool.map, args=("big", create, [f"big-{i}" for i in range(20)]))
    big.start()
    assert started.wait(5)
    small = threading.Thread(target=pool.map, args=("small", create, ["small-0", "small-1"]))
    small.start()
    time.sleep(0.1)  # the small job's creates are queued while the big gang's first is in flight
    go.set()
    big.join(5)
    small.join(5)
    pool.close()
    assert order[:5] == ["big-0", "big-1", "small-0", "big-2", "small-1"]
    assert len(order) == 22


def test_in_flight_stays_at_the_worker_count_and_every_item_is_done() -> None:
    pool = FairPool(workers=3)
    mu, active, peak, done = threading.Lock(), [0], [0], []

    def create(item: tuple[str, int]) -> tuple[str, int]:
        with mu:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.005)
        with mu:
            active[0] -= 1
            done.append(item)
        return item

    jobs = [threading.Thread(target=pool.map, args=(k, create, [(k, i) for i in range(10)])) for k in "abcd"]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(10)
    pool.close()
    assert peak[0] <= 3 and len(done) == 40
    assert sorted(done) == sorted((k, i) for k in "abcd" for i in range(10))


def test_a_failure_reaches_its_caller_in_item_order() -> None:
    pool = FairPool(workers=2)

    def create(n: int) -> int:
        if n in (2, 4):
            raise ValueError(f"refused {n}")
        return n

    futures = pool.map("job", create, list(range(6)))
    assert [f.exception() is None for f in futures] == [True, True, False, True, False, True]
    with pytest.raises(ValueError, match="refused 2"):
        for f in futures:
            f.result()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.map("job", create, [1])


def test_a_pass_with_nothing_to_create_leaves_every_worker_serving() -> None:
    pool = FairPool(workers=2)
    for _ in range(5):  # every pod of the gang already there: nothing to create
        assert pool.map("job", lambda n: n, []) == []
    done = threading.Event()
    thread = threading.Thread(target=lambda: (pool.map("job", lambda n: n, [1, 2, 3]), done.set()))
    thread.start()
    assert done.wait(5), "the pool stopped serving"
    pool.close()


def test_close_fails_what_is_still_queued() -> None:
    pool = FairPool(workers=1)
    gate = threading.Event()
    results: list[Exception | None] = []

    def run() -> None:
        futures = pool.map("job", lambda n: gate.wait(5) and n, [1, 2, 3])
        results.extend(f.exception() for f in futures)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.1)
    closer = threading.Thread(target=pool.close)
    closer.start()
    time.sleep(0.1)
    gate.set()
    thread.join(5)
    closer.join(10)
    assert results[0] is None and all(isinstance(e, RuntimeError) for e in results[1:]), results
