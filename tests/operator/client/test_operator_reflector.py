"""The operator's reflectors, against a scripted server: LIST, then WATCH from the list's version, resumed from the
last version seen, listed again on 410 Gone, backed off on a refusal; pods ask for passes, children only fill the
cache; reflectors sharing a client stop together. (The e2e tests run them against the emulator.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import urllib3
from budget import budget

from zerotrain.operator.children import naming
from zerotrain.operator.client.cache import Key, ObjectCache
from zerotrain.operator.client.kube import Kube, KubeError, Listing
from zerotrain.operator.client.reflector import POD_KIND, ChildSink, PodSink, Reflector, stop_all

Obj = dict[str, Any]


def pod(job: str, name: str, rv: str, phase: str = "Running") -> Obj:
    labels = {naming.LABEL_JOB: job, naming.LABEL_MANAGED_BY: naming.MANAGER}
    md = {"namespace": "a", "name": name, "resourceVersion": rv, "labels": labels}
    return {"kind": "Pod", "metadata": md, "status": {"phase": phase}}


def until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + budget(timeout)
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@dataclass
class Cut:
    """A stream that brings `events`, then breaks with `error`."""

    events: list[tuple[str, Obj]]
    error: Exception


Script = list[list[tuple[str, Obj]] | KubeError | Cut]


class ScriptedServer:
    """Answers each LIST from `lists` and each WATCH from `watches` in turn (an exception entry is raised); once
    the script is spent, a watch waits until stopped, as a quiet one does."""

    def __init__(self, lists: list[Listing], watches: Script) -> None:
        self.lists, self.watches = lists, watches
        self.asked: list[str | None] = []
        """The resourceVersion each WATCH started from."""
        self.listed = 0
        self._quiet = threading.Event()

    def list_owned(self, kind: tuple[str, str], namespace: str | None) -> Listing:
        self.listed += 1
        return self.lists.pop(0)

    def watch(self, path: str, query: dict[str, str], timeout_seconds: int) -> Iterator[tuple[str, Obj]]:
        self.asked.append(query.get("resourceVersion"))
        if not self.watches:
            self._quiet.wait(10)
            return
        step = self.watches.pop(0)
        if isinstance(step, KubeError):
            raise step
        if isinstance(step, Cut):
            yield from step.events
            raise step.error
        yield from step

    def stop_watches(self) -> None:
        self._quiet.set()


def started(server: ScriptedServer, changed: Callable[[Key], None]) -> tuple[Reflector, ObjectCache]:
    cache = ObjectCache()
    watch = Reflector(cast(Kube, server), POD_KIND, "a", PodSink(cache, "a", changed), max_backoff_seconds=0.05)
    watch.start()
    return watch, cache


def followed(server: ScriptedServer, changed: Callable[[Key], None], done: Callable[[], bool]) -> ObjectCache:
    """The cache a pod reflector on `server` filled by the time `done` held (within 5 s); the reflector stopped."""
    watch, cache = started(server, changed)
    try:
        until(done, timeout=5)
    finally:
        watch.stop()
    return cache


def names(cache: ObjectCache, job: str) -> list[str]:
    return [p["metadata"]["name"] for p in cache.pods(("a", job)) or []]


def test_it_follows_the_list_from_its_version_and_resumes_from_the_last_event() -> None:
    server = ScriptedServer(
        [Listing([pod("j", "j-0", "10")], "10")],
        [
            [("ADDED", pod("j", "j-1", "11")), ("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [("DELETED", pod("j", "j-0", "16")), ("MODIFIED", pod("j", "j-1", "17", phase="Failed"))],
        ],
    )
    seen: list[Key] = []
    cache = followed(server, seen.append, lambda: len(server.asked) == 3)
    assert server.asked == ["10", "15", "17"]  # the list's version, then the bookmark's, then the last event's
    assert names(cache, "j") == ["j-1"] and (cache.pods(("a", "j")) or [{}])[0]["status"]["phase"] == "Failed"
    assert seen == [("a", "j")] * 3 and server.listed == 1  # the first list asks for no pass: kopf resumes jobs


def test_410_gone_lists_again_and_asks_for_a_pass_of_every_job_it_covers() -> None:
    gone = {"code": 410, "reason": "Expired", "message": "too old resource version"}
    server = ScriptedServer(
        [Listing([pod("j", "j-0", "10")], "10"), Listing([pod("k", "k-0", "30")], "30")],
        [[("ERROR", gone)]],
    )
    seen: list[Key] = []
    cache = followed(server, seen.append, lambda: len(server.asked) == 2)
    assert server.listed == 2 and server.asked == ["10", "30"]
    assert names(cache, "j") == [] and names(cache, "k") == ["k-0"]  # j-0 went while the watch was gone
    assert sorted(seen) == [("a", "j"), ("a", "k")]


def test_a_refused_watch_is_retried_after_a_back_off_from_the_same_version() -> None:
    refused = KubeError(403, "Forbidden", 'pods is forbidden: cannot watch resource "pods"', "GET")
    server = ScriptedServer([Listing([], "10")], [refused, refused, [("ADDED", pod("j", "j-0", "12"))]])
    watch, cache = started(server, lambda _: None)
    t0 = time.monotonic()
    try:
        until(lambda: len(server.asked) == 4, timeout=5)
    finally:
        watch.stop()
    assert server.asked == ["10", "10", "10", "12"] and server.listed == 1
    assert names(cache, "j") == ["j-0"] and time.monotonic() - t0 >= 0.05


def test_stop_ends_a_quiet_watch() -> None:
    server = ScriptedServer([Listing([], "10")], [])
    watch, _ = started(server, lambda _: None)
    until(lambda: server.asked == ["10"], timeout=5)
    t0 = time.monotonic()
    watch.stop()
    assert time.monotonic() - t0 < 2 and not watch._thread.is_alive()


def service(name: str, rv: str) -> Obj:
    labels = {naming.LABEL_JOB: name, naming.LABEL_MANAGED_BY: naming.MANAGER}
    return {"kind": "Service", "metadata": {"namespace": "a", "name": name, "resourceVersion": rv, "labels": labels}}


def test_children_fill_the_cache_and_a_relist_drops_what_went_unseen() -> None:
    gone = {"code": 410, "reason": "Expired", "message": "too old resource version"}
    server = ScriptedServer(
        [Listing([service("j", "10"), service("k", "11")], "11"), Listing([service("l", "30")], "30")],
        [[("ADDED", service("m", "12")), ("DELETED", service("j", "13"))], [("ERROR", gone)]],
    )
    cache = ObjectCache()
    kind = ("v1", "services")
    watch = Reflector(cast(Kube, server), kind, "a", ChildSink(cache, "services", "a"), max_backoff_seconds=0.05)
    watch.start()
    try:
        until(lambda: server.listed == 2 and len(server.asked) == 3, timeout=5)
    finally:
        watch.stop()
    assert server.asked == ["11", "13", "30"]
    held = [n for n in "jklm" if cache.child("services", "a", n) is not None]
    assert held == ["l"]  # k and m went while the watch was gone; j was deleted


def test_reflectors_on_one_client_all_stop_promptly_and_none_watches_again() -> None:
    server = ScriptedServer([Listing([], "10"), Listing([], "20")], [])
    cache = ObjectCache()
    watches = [
        Reflector(cast(Kube, server), POD_KIND, "a", PodSink(cache, "a", lambda _: None)),
        Reflector(cast(Kube, server), ("v1", "services"), "a", ChildSink(cache, "services", "a")),
    ]
    for w in watches:
        w.start()
    until(lambda: len(server.asked) == 2, timeout=5)
    t0 = time.monotonic()
    stop_all(watches)
    # Every one was told before the shared client's streams were cut: none started another watch.
    assert len(server.asked) == 2 and time.monotonic() - t0 < 2
    assert not any(w._thread.is_alive() for w in watches)


def test_a_stream_cut_midway_resumes_after_its_last_event() -> None:
    cut = urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead")
    server = ScriptedServer(
        [Listing([], "10")], [Cut([("ADDED", pod("j", "j-0", "11")), ("ADDED", pod("j", "j-1", "12"))], cut)]
    )
    cache = followed(server, lambda _: None, lambda: len(server.asked) == 2)
    assert server.asked == ["10", "12"] and server.listed == 1  # not "10" again: both events would come twice
    assert names(cache, "j") == ["j-0", "j-1"]


def test_a_sink_that_raises_does_not_end_the_watch() -> None:
    server = ScriptedServer(
        [Listing([], "10")], [[("ADDED", pod("j", "j-0", "11"))], [("ADDED", pod("j", "j-1", "12"))]]
    )
    calls: list[Key] = []

    def changed(job: Key) -> None:
        calls.append(job)
        if len(calls) == 1:
            raise TypeError("a bug in the sink")

    cache = followed(server, changed, lambda: len(calls) == 2)
    assert names(cache, "j") == ["j-0", "j-1"]
