"""A pod's launcher across in-place restarts (spec.failurePolicy.restartStrategy InPlace): it watches its own pod, so
the operator's word reaches it, and writes there when a round of its ranks ended.

The protocol (`zerotrain.pod_contract`): the pod's gang label moved past the round its ranks run means "stop them";
its round annotation naming a later round (with the gang label on it) means "start that one"; `exit` means "end with
the last round's outcome". The launcher answers with ROUND_END_ANNOTATION once every rank of a round stopped. The
pod's ServiceAccount may get, watch and patch the job's own pods alone (`operator.children.supporting.build_rbac`).

One watch per pod (a field selector on its name), reopened every minute with a fresh service-account token (bound
tokens rotate), and from a fresh read after the server says its resourceVersion is too old (410).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any

import kubernetes

from zerotrain.pod_contract import (
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    POD_NAME_ENV,
    ROUND_ANNOTATION,
    ROUND_END_ANNOTATION,
    ROUND_EXIT,
)
from zerotrain.pod_rounds import RoundEnd, parse_round
from zerotrain.runtime.job.status_report import TIMEOUT_SECONDS, _api, _api_url
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.training_spec import RestartStrategy

if TYPE_CHECKING:  # torch: the launcher has it; a test of the protocol need not
    from zerotrain.runtime.job.launch import LaunchOutcome

log = logging.getLogger(__name__)

LABEL_GANG = "zerotrain.dev/gang"  # operator.children.naming.LABEL_GANG (the runtime imports nothing of the operator)
WATCH_SECONDS = 60
RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class PodWord:
    """What the pod's metadata says now."""

    gang: int | None
    """Its gang label."""
    round: int | None
    """The round it may run (its round annotation), None when absent or `exit`."""
    exit: bool = False
    """Its round annotation says `exit`."""


class PodRounds:
    """The launcher's view of its own pod, kept by a watch thread; and its reports there."""

    def __init__(self, namespace: str, pod: str, base: str) -> None:
        self.namespace, self.pod, self.base = namespace, pod, base
        self._word = PodWord(None, None)
        self._seen = threading.Condition()
        self._known = False
        self._refused: str | None = None
        """Why the pod cannot be read (the server refused the first read), if it cannot."""
        self._closed = False
        self._terminated = False
        self._stops: dict[int, threading.Event] = {}
        self._between_rounds = False
        """No rank runs or is being started: SIGTERM ends the waits, not the process at once."""
        self._sigterm: signal.Handlers | Callable[[int, FrameType | None], Any] | int | None = None
        """The SIGTERM handler before `first_round` installed its own, put back by `close`."""
        self._watching: Any = None
        """The watch under way (its open HTTP response, urllib3's, is closed by `close`)."""
        self._thread = threading.Thread(target=self._watch, name="zerotrain-pod-watch", daemon=True)
        self._thread.start()

    # -- what the pod says --------------------------------------------------------------------------------------

    def first_round(self, timeout: float = 30.0) -> int | None:
        """The round this pod was created for (its annotation, else its gang label), once read; None when the pod
        cannot be read (its Role lacks the grant, the server is unreachable for `timeout`): then it runs one round
        and ends with it, as a pod recreated on restart does."""
        if threading.current_thread() is threading.main_thread():  # a test may follow a pod from another thread
            # SIGTERM (the pod is being deleted) between rounds ends the waits, then the launcher with the last
            # round's outcome; while ranks run torch's launcher forwards it to them (`launch` puts this handler back
            # after); before they start (a rendezvous) it ends the launcher at once, as without rounds.
            self._sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        with self._seen:
            self._seen.wait_for(lambda: self._known or self._refused is not None, timeout)
            word, refused = self._word, self._refused
        found = word.round if word.round is not None else word.gang
        if found is None:
            why = refused or f"no {ROUND_ANNOTATION} annotation or {LABEL_GANG} label seen within {timeout:g} s"
            log.warning("pod %s: cannot follow in-place restarts (%s); it will be recreated on restart", self.pod, why)
        return found

    def stop_event(self, round_: int) -> threading.Event:
        """Set once the pod's gang label passes `round_` or it is told to exit: its ranks are to stop."""
        stop = threading.Event()
        with self._seen:
            self._stops = {round_: stop}
            if self._ends(round_):
                stop.set()
        return stop

    def _ends(self, round_: int) -> bool:
        w = self._word
        return w.exit or (w.gang is not None and w.gang > round_)

    def next_round(self, after: int) -> int | None:
        """Wait for word after round `after` ended: the next round's number, or None (told to exit, or SIGTERM: the
        pod is being deleted)."""
        self._between_rounds = True
        with self._seen:
            while True:
                w = self._word
                if self._terminated or w.exit:
                    return None
                if w.round is not None and w.round > after and w.gang == w.round:
                    self._between_rounds = False
                    return w.round
                self._seen.wait(0.5)  # a signal handler runs between waits

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._terminated = True
        if not self._between_rounds:  # waiting for its peers, say: end as a pod without rounds would
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    # -- what the launcher says ---------------------------------------------------------------------------------

    def report_end(self, round_: int, exit_code: int, line: str) -> None:
        """Every rank of `round_` stopped, as `exit_code` and the termination message `line` say: say so on the pod.
        Retried until the server takes it (the operator waits for it), unless the pod is gone or SIGTERM came."""
        record = RoundEnd(round=round_, exit_code=exit_code, message=line, finished_at=datetime.now(timezone.utc))
        patch = {"metadata": {"annotations": {ROUND_END_ANNOTATION: record.annotation()}}}
        self._between_rounds = True  # SIGTERM from here on ends the waits, and then the launcher
        while not self._terminated:
            try:
                with _api(self.base) as client:
                    kubernetes.client.CoreV1Api(client).patch_namespaced_pod(
                        self.pod,
                        self.namespace,
                        patch,
                        _content_type="application/merge-patch+json",
                        _request_timeout=TIMEOUT_SECONDS,
                    )
                return
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    return
                log.warning("could not report round %s's end on pod %s: %s", round_, self.pod, e.reason)
            except Exception as e:  # the server unreachable a moment: the operator waits, so must this
                log.warning("could not report round %s's end on pod %s: %s", round_, self.pod, e)
            time.sleep(RETRY_SECONDS)

    def close(self) -> None:
        """Stop following the pod: the watch's connection is closed now, not when its minute is up."""
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        with self._seen:
            self._closed = True
            self._seen.notify_all()
            response = getattr(self._watching, "_resp", None)  # the client keeps no public handle on it
        if response is not None:
            _hang_up(response)

    # -- the watch ----------------------------------------------------------------------------------------------

    def _update(self, pod: kubernetes.client.V1Pod) -> None:
        md = pod.metadata
        labels = (md.labels if md is not None else None) or {}
        notes = (md.annotations if md is not None else None) or {}
        raw = notes.get(ROUND_ANNOTATION)
        word = PodWord(parse_round(labels.get(LABEL_GANG)), parse_round(raw), raw == ROUND_EXIT)
        with self._seen:
            self._word, self._known = word, True
            for round_, stop in self._stops.items():
                if self._ends(round_):
                    stop.set()
            self._seen.notify_all()

    def _watch(self) -> None:
        version: str | None = None
        while not self._closed:
            try:
                with _api(self.base) as client:
                    api = kubernetes.client.CoreV1Api(client)
                    if version is None:
                        pod = self._read(api)
                        self._update(pod)
                        version = pod.metadata.resource_version if pod.metadata is not None else None
                    version = self._follow(api, version or "")
            except kubernetes.client.ApiException as e:
                if e.status == 410:
                    version = None  # too old for the server's history: read the pod afresh
                else:
                    log.warning("watching pod %s: %s", self.pod, e.reason)
                    time.sleep(RETRY_SECONDS)
            except Exception as e:
                if self._closed:  # `close` hung the stream up
                    return
                log.warning("watching pod %s: %s", self.pod, e)
                time.sleep(RETRY_SECONDS)

    def _read(self, api: kubernetes.client.CoreV1Api) -> kubernetes.client.V1Pod:
        try:
            return api.read_namespaced_pod(self.pod, self.namespace, _request_timeout=TIMEOUT_SECONDS)
        except kubernetes.client.ApiException as e:
            if e.status in (401, 403, 404) and not self._known:
                with self._seen:
                    self._refused = f"reading pod {self.namespace}/{self.pod}: {e.status} {e.reason}"
                    self._seen.notify_all()
            raise

    def _follow(self, api: kubernetes.client.CoreV1Api, version: str) -> str | None:
        """Stream the pod's changes from `version` for up to WATCH_SECONDS; the newest version seen."""

        self._watching = kubernetes.watch.Watch()
        stream = self._watching.stream(
            api.list_namespaced_pod,
            self.namespace,
            field_selector=f"metadata.name={self.pod}",
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=WATCH_SECONDS + 15,
        )
        for event in stream:
            pod = event["object"]
            if event["type"] == "ERROR":
                raise kubernetes.client.ApiException(status=getattr(pod, "code", 500) or 500, reason=str(pod))
            md = getattr(pod, "metadata", None)
            if md is None:
                continue
            version = md.resource_version or version
            if md.name == self.pod and event["type"] in ("ADDED", "MODIFIED"):
                self._update(pod)
        return version


def _hang_up(response: Any) -> None:
    """End a streamed response that another thread reads from. Closing it would wait for that read (the reader
    holds its buffer's lock until the server's next event, up to a minute); shutting its socket down ends the read
    at once, with end of stream."""
    connection = getattr(response, "_connection", None)  # urllib3's HTTPResponse keeps its connection here
    sock = getattr(connection, "sock", None)
    if sock is None:
        sock = getattr(getattr(getattr(getattr(response, "_fp", None), "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def stays(outcome: LaunchOutcome) -> bool:
    """Whether a launcher waits in its pod for the next round after `outcome`: after a rank failure, or its ranks
    stopped for a peer's SIGTERM or by the operator; not when it finished, was refused, or was itself signalled."""
    from zerotrain.runtime.job.launch import Outcome

    if outcome.to_launcher:
        return False
    return outcome.reason in (Outcome.RANK_FAILED, Outcome.STOPPED, Outcome.PREEMPTED)


def for_pod(spec: ZeroTrainingJobSpec) -> PodRounds | None:
    """The pod's rounds where an in-place restart can reach it: a job's pod (its name and job in the environment,
    the API server known) whose spec asks for InPlace and has a checkpoint claim; None otherwise (it ends with its
    ranks, as before)."""
    policy = spec.failure_policy.restart_strategy
    if policy != RestartStrategy.IN_PLACE or not spec.checkpoint.claim_name:
        return None
    pod, job, base = os.environ.get(POD_NAME_ENV), os.environ.get(JOB_NAME_ENV), _api_url()
    if not pod or not job or base is None:
        return None
    return PodRounds(os.environ.get(NAMESPACE_ENV) or "default", pod, base)
