"""kopf's handlers run one pass and hand the passes asked for meanwhile to the operator's own threads: kopf takes one
object's events one after another, so a handler that kept looping would hold back that job's watch events."""

from __future__ import annotations

import threading
import time

import kubernetes

from zerotrain.operator.client.kube import Kube
from zerotrain.operator.controller.reconcile import PassOutcome, Reconciler, Result
from zerotrain.operator.settings import OperatorSettings


def reconciler_with_passes(passes: list[str], during_first: threading.Event, may_finish: threading.Event) -> Reconciler:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"  # never called: the passes are stand-ins
    r = Reconciler(kube=Kube(cfg), settings=OperatorSettings())

    def timed(key: tuple[str, str]) -> PassOutcome:
        passes.append(threading.current_thread().name)
        if len(passes) == 1:
            during_first.set()
            may_finish.wait(5)
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    return r


def test_a_handler_runs_one_pass_and_hands_the_next_to_the_operators_threads() -> None:
    passes: list[str] = []
    during_first, may_finish = threading.Event(), threading.Event()
    r = reconciler_with_passes(passes, during_first, may_finish)
    outcome: list[PassOutcome | None] = []
    handler = threading.Thread(target=lambda: outcome.append(r.reconcile("a", "j", hand_off=True)), name="kopf")
    handler.start()
    assert during_first.wait(5)
    assert r.reconcile("a", "j") is None  # a pod event meanwhile: coalesced into one more pass
    may_finish.set()
    handler.join(5)
    assert outcome and outcome[0] is not None and outcome[0].result == Result.OK
    r._reruns.shutdown(wait=True)
    assert passes[0] == "kopf" and len(passes) == 2 and passes[1].startswith("zerotrain-rerun")
    r.close()


def test_the_resync_keeps_running_the_passes_itself() -> None:
    passes: list[str] = []
    during_first, may_finish = threading.Event(), threading.Event()
    r = reconciler_with_passes(passes, during_first, may_finish)
    resync = threading.Thread(target=r.reconcile, args=("a", "j"), name="resync")
    resync.start()
    assert during_first.wait(5)
    r.reconcile("a", "j")
    may_finish.set()
    resync.join(5)
    assert passes == ["resync", "resync"]
    r.close()


def bare_reconciler(**settings: float) -> Reconciler:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"  # never called: the passes are stand-ins
    return Reconciler(kube=Kube(cfg), settings=OperatorSettings(**settings))


def test_a_gone_job_asked_for_again_never_runs_two_passes_at_once() -> None:
    """A pass that finds the job gone while an event asks for another: the state stays the loop's until it ends, so a
    job re-created under the name meanwhile waits for it instead of starting a second, concurrent pass."""
    r = bare_reconciler()
    running, most, passes = [0], [0], [0]
    in_second, release = threading.Event(), threading.Event()
    mu = threading.Lock()

    def once(*key: str) -> PassOutcome:
        with mu:
            running[0] += 1
            most[0] = max(most[0], running[0])
            passes[0] += 1
            n = passes[0]
        if n == 1:
            assert r.reconcile(*key) is None  # an event during the pass that finds the job gone
        elif n == 2:
            in_second.set()
            release.wait(5)
        with mu:
            running[0] -= 1
        return PassOutcome(Result.GONE if n == 1 else Result.OK)

    r._once = once  # type: ignore[method-assign]
    first = threading.Thread(target=r.reconcile, args=("a", "j"))
    first.start()
    assert in_second.wait(5)
    assert r.reconcile("a", "j") is None  # the re-created job's event: coalesced into the running loop
    release.set()
    first.join(5)
    assert most[0] == 1 and passes[0] == 3
    r.close()


def test_busy_jobs_take_turns_with_the_others_on_the_rerun_threads() -> None:
    """Five jobs whose every pass is asked for again (a gang's pod events) and one with a single rerun: each rerun
    runs one pass and goes to the back of the queue, so the quiet job's rerun runs long before the busy ones stop."""
    r = bare_reconciler()
    order: list[str] = []
    mu = threading.Lock()
    budget = {f"busy{i}": 100 for i in range(5)}
    quiet_asked = threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        with mu:
            order.append(key[1])
        if key[1] in budget and budget[key[1]] > 0:
            budget[key[1]] -= 1
            r.reconcile(*key)  # asked for again while it runs
        if key[1] == "quiet" and not quiet_asked.is_set():
            quiet_asked.set()
            r.reconcile(*key)
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    for name in budget:
        r.reconcile("a", name, hand_off=True)
    r.reconcile("a", "quiet", hand_off=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and order.count("quiet") < 2:
        time.sleep(0.01)
    r._reruns.shutdown(wait=True)
    with mu:
        first = order.index("quiet")  # counted from the quiet job's own first pass: before it, nothing was asked
        busy_before = order[first : order.index("quiet", first + 1)].count("busy0")
    assert order.count("quiet") == 2
    assert busy_before < 10, f"the quiet job's rerun waited for {busy_before} passes of one busy job"
    r.close()


def test_a_handed_off_pass_that_fails_is_tried_again() -> None:
    r = bare_reconciler(restart_backoff_seconds=0.1)
    passes: list[str] = []
    again = threading.Event()

    def timed(key: tuple[str, str]) -> PassOutcome:
        passes.append(threading.current_thread().name)
        if len(passes) == 1:
            assert r.reconcile(*key) is None
        elif len(passes) == 2:
            raise RuntimeError("the server went away")
        else:
            again.set()
        return PassOutcome(Result.OK)

    r._timed = timed  # type: ignore[method-assign]
    r.reconcile("a", "j", hand_off=True)
    assert again.wait(5), passes
    r.close()
