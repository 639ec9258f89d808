"""kopf's handlers run one pass and hand the passes asked for meanwhile to the operator's own threads: kopf takes one
object's events one after another, so a handler that kept looping would hold back that job's watch events."""

from __future__ import annotations

import threading

import kubernetes

from zerotrain.operator.kube import Kube
from zerotrain.operator.reconcile import PassOutcome, Reconciler, Result
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
