"""One way into a pass: every ask adds a job key to one work queue, and a fixed set of workers runs the passes,
never two of one job at once, each job in turn with the others, a failed or held-back pass retried after the job's
one back-off."""

from __future__ import annotations

import itertools
import threading
import time

import kubernetes
import pytest
from budget import budget

from zerotrain.operator.client.kube import Kube
from zerotrain.operator.client.work_queue import WorkQueue
from zerotrain.operator.controller.reconcile import PassOutcome, Reconciler, Result
from zerotrain.operator.settings import OperatorSettings


def test_a_key_added_twice_while_it_waits_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue(lambda n: 1.0)
    q.add("a")
    q.add("b")
    q.add("a")
    assert len(q) == 2
    assert q.get() == "a" and q.get() == "b" and len(q) == 0
    q.shut_down()


def test_a_key_added_while_held_waits_for_done_and_goes_to_the_back() -> None:
    q: WorkQueue[str] = WorkQueue(lambda n: 1.0)
    q.add("busy")
    assert q.get() == "busy"
    q.add("busy")  # its pod events while its pass runs
    q.add("busy")
    q.add("quiet")
    assert q.get() == "quiet"  # not the held key: never two passes of a job at once
    q.done("quiet")
    q.done("busy")
    assert len(q) == 1 and q.get() == "busy"
    q.shut_down()


def test_the_earliest_delayed_add_wins_and_arrives_when_due() -> None:
    q: WorkQueue[str] = WorkQueue(lambda n: 1.0)
    q.add_after("j", 60)
    q.add_after("j", 0.05)
    q.add_after("j", 30)  # later than one already asked for: it stands
    assert q.delayed() == 1 and len(q) == 0
    deadline = time.monotonic() + budget(5)
    while not len(q) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert q.get() == "j" and q.delayed() == 0
    q.shut_down()


def test_one_back_off_per_key_grows_with_each_failure_and_forget_resets_it() -> None:
    q: WorkQueue[str] = WorkQueue(lambda n: 100.0 * 2 ** (n - 1))
    assert [q.add_rate_limited("j") for _ in range(3)] == [100.0, 200.0, 400.0]
    assert q.add_rate_limited("other") == 100.0
    q.forget("j")
    assert q.failures("j") == 0 and q.add_rate_limited("j") == 100.0
    q.shut_down()


def test_shut_down_releases_every_waiting_worker() -> None:
    q: WorkQueue[str] = WorkQueue(lambda n: 1.0)
    got: list[str | None] = []
    workers = [threading.Thread(target=lambda: got.append(q.get())) for _ in range(3)]
    for w in workers:
        w.start()
    q.shut_down()
    for w in workers:
        w.join(budget(5))
    assert got == [None, None, None]
    q.add("late")  # ignored: nobody takes it any more
    assert len(q) == 0


def bare_reconciler(**settings: float) -> Reconciler:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"  # never called: the passes are stand-ins
    return Reconciler(kube=Kube(cfg), settings=OperatorSettings(**settings))


def wait_for(done: threading.Event, what: str, seconds: float = 5) -> None:
    assert done.wait(budget(seconds)), what


def test_asks_during_a_pass_never_start_a_second_pass_of_the_job() -> None:
    r = bare_reconciler(reconcile_workers=4)
    running, most, passes = [0], [0], [0]
    mu = threading.Lock()
    first, release, all_done = threading.Event(), threading.Event(), threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        with mu:
            running[0] += 1
            most[0] = max(most[0], running[0])
            passes[0] += 1
            n = passes[0]
        if n == 1:
            first.set()
            release.wait(budget(5))
        with mu:
            running[0] -= 1
        if n == 2:
            all_done.set()
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    r.ask(("a", "j"))
    wait_for(first, "no worker took the job")
    for _ in range(50):  # a gang's pod events while the pass runs, spread over four idle workers
        r.ask(("a", "j"))
    release.set()
    wait_for(all_done, "the asks during the pass did not run one more")
    time.sleep(0.2)
    assert most[0] == 1 and passes[0] == 2
    r.close()


def test_busy_jobs_take_turns_with_a_quiet_one() -> None:
    """Five jobs whose every pass is asked for again (a gang's pod events) and one with a single pass more: each
    asked-for pass goes to the back of the queue, so the quiet job's second pass runs long before the busy ones stop."""
    r = bare_reconciler(reconcile_workers=2)
    order: list[str] = []
    mu = threading.Lock()
    left = {f"busy{i}": 100 for i in range(5)}
    quiet_again = threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        with mu:
            order.append(key[1])
            if left.get(key[1], 0) > 0:
                left[key[1]] -= 1
                r.ask(key)
        if key[1] == "quiet":
            if order.count("quiet") == 1:
                r.ask(key)
            else:
                quiet_again.set()
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    for name in left:
        r.ask(("a", name))
    r.ask(("a", "quiet"))
    wait_for(quiet_again, "the quiet job's second pass never ran", 10)
    r.close()
    with mu:
        first = order.index("quiet")
        busy_between = order[first : order.index("quiet", first + 1)].count("busy0")
    assert busy_between < 5, f"the quiet job's pass waited for {busy_between} passes of one busy job"


@pytest.mark.parametrize("how", ["raises", "held back"])
def test_a_pass_that_could_not_act_is_retried_after_the_jobs_back_off(how: str) -> None:
    r = bare_reconciler(restart_backoff_seconds=0.1)
    times: list[float] = []
    again = threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        times.append(time.monotonic())
        if len(times) < 3:
            if how == "raises":
                raise RuntimeError("the server went away")
            return PassOutcome(Result.ERROR, "a child write was refused", retry=True)
        again.set()
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    r.ask(("a", "j"))
    wait_for(again, f"not retried: {times}")
    r.close()  # lets the pass that acted end
    assert r.queue.failures(("a", "j")) == 0  # and it reset the back-off
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps  # 0.1 s, then doubled


def test_a_pass_that_asks_to_be_looked_at_later_is() -> None:
    r = bare_reconciler()
    times: list[float] = []
    second = threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        times.append(time.monotonic())
        if len(times) == 2:
            second.set()
        return PassOutcome(Result.OK, requeue_after=0.2 if len(times) == 1 else None)

    r._timed = timed  # type: ignore[method-assign]
    r.ask(("a", "j"))
    wait_for(second, "the requeue never came")
    assert times[1] - times[0] >= 0.19
    r.close()


def test_close_ends_the_workers_and_later_asks_run_nothing() -> None:
    r = bare_reconciler(reconcile_workers=3)
    ran = threading.Event()
    r._timed = lambda key: (ran.set(), PassOutcome(Result.OK))[1]  # type: ignore[method-assign]
    r.ask(("a", "j"))
    wait_for(ran, "no pass ran")
    r.close()
    assert r._workers and not any(t.is_alive() for t in r._workers)
    ran.clear()
    r.ask(("a", "k"))
    assert not ran.wait(0.2)
