"""The operator's watch-fed cache: what it answers, what it admits it does not know, and how writes, events and
LISTs that cross each other settle on the newest state."""

from __future__ import annotations

import copy
from typing import Any

from zerotrain.operator.children import naming
from zerotrain.operator.client.cache import ObjectCache, newer
from zerotrain.operator.client.kube import Listing
from zerotrain.operator.controller.observe import observe_pods

Obj = dict[str, Any]


def job(name: str, rv: str, phase: str = "Running", ns: str = "a") -> Obj:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}, "status": {"phase": phase}}


def pod(job_name: str, name: str, rv: str, phase: str = "Running", ns: str = "a", **md: Any) -> Obj:
    labels = {naming.LABEL_JOB: job_name, naming.LABEL_MANAGED_BY: naming.MANAGER}
    return {
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "labels": labels, **md},
        "status": {"phase": phase},
    }


def test_an_answer_older_than_a_watch_event_does_not_replace_it() -> None:
    cache = ObjectCache()
    cache.put_job(job("j", "7", "Running"))  # a watch event of a change made after the write below
    cache.put_job(job("j", "5", "Pending"))  # the answer to that write, arriving late
    assert cache.job(("a", "j")) == job("j", "7", "Running")
    cache.put_job(job("j", "9", "Failed"))
    assert (cache.job(("a", "j")) or {})["status"]["phase"] == "Failed"
    # Versions that are not integers are opaque: the newest put wins.
    assert newer(job("j", "x1"), job("j", "7")) and newer(job("j", "5"), None)


def test_what_it_hands_out_is_a_copy() -> None:
    cache = ObjectCache()
    cache.put_job(job("j", "1"))
    got = cache.job(("a", "j"))
    assert got is not None
    got["status"]["phase"] = "Tampered"
    assert (cache.job(("a", "j")) or {})["status"]["phase"] == "Running"


def test_pods_are_handed_out_as_held_and_reading_them_changes_nothing() -> None:
    """Every pass reads all its job's pods: they come without a copy (a 500-pod job's copies cost 0.3-0.5 s a pass
    on a real server), so what reads them must leave them as they are."""
    cache = ObjectCache()
    listed = [pod("j", f"j-worker-{i}", str(3 + i), "Pending" if i else "Failed") for i in range(3)]
    cache.known_pods(("a", "j"), Listing(listed, "9"))
    handed = cache.pods(("a", "j")) or []
    assert [id(p) for p in handed] == [id(p) for p in cache.pods(("a", "j")) or []]
    before = copy.deepcopy(handed)
    observed = observe_pods(handed)
    assert [o.name for o in observed] == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert cache.pods(("a", "j")) == before


def test_pods_are_unknown_until_listed_then_events_keep_them() -> None:
    cache = ObjectCache()
    cache.put_pod(pod("j", "j-worker-0", "3"))  # an event alone does not make the set complete
    assert cache.pods(("a", "j")) is None
    assert cache.job(("a", "j")) is None
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-0", "3"), pod("j", "j-worker-1", "4")], "4"))
    assert [p["metadata"]["name"] for p in cache.pods(("a", "j")) or []] == ["j-worker-0", "j-worker-1"]
    cache.put_pod(pod("j", "j-worker-1", "8", "Failed"))
    cache.drop_pod(pod("j", "j-worker-0", "9"))
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in cache.pods(("a", "j")) or []] == [
        ("j-worker-1", "Failed")
    ]
    assert cache.pods(("a", "other")) is None
    cache.put_pod({"metadata": {"namespace": "a", "name": "not-ours", "labels": {}}})  # no job label: ignored
    assert cache.pods(("a", "not-ours")) is None


def test_a_listing_keeps_events_that_came_while_it_ran_and_drops_what_it_no_longer_shows() -> None:
    cache = ObjectCache()
    cache.put_pod(pod("j", "j-worker-0", "3"))  # deleted before the LIST, its DELETED event missed
    cache.put_pod(pod("j", "j-worker-2", "12"))  # created after the LIST's snapshot (rv 10)
    cache.put_pod(pod("j", "j-worker-1", "11", "Failed"))  # changed after the snapshot, listed older
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-1", "6", "Running")], "10"))
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in cache.pods(("a", "j")) or []] == [
        ("j-worker-1", "Failed"),
        ("j-worker-2", "Running"),
    ]


def test_a_namespace_relisted_drops_jobs_gone_unseen_and_keeps_those_newer_than_the_list() -> None:
    cache = ObjectCache()
    cache.put_job(job("gone", "2"))
    cache.put_job(job("fresh", "30"))  # created after the LIST (rv 20): kept though not listed
    cache.put_job(job("elsewhere", "2", ns="b"))
    present, gone = cache.relisted_jobs("a", Listing([job("kept", "5"), job("idle", "6")], "20"))
    assert present == [("a", "idle"), ("a", "kept")] and gone == [("a", "gone")]
    assert cache.job(("a", "gone")) is None and cache.job(("a", "fresh")) is not None
    assert cache.job_keys() == [("a", "fresh"), ("a", "idle"), ("a", "kept"), ("b", "elsewhere")]
    assert cache.pods(("a", "kept")) is None  # a LIST of jobs says nothing of their pods
    assert cache.relisted_jobs(None, Listing([], "40"))[1] == sorted(
        [("a", "fresh"), ("a", "idle"), ("a", "kept"), ("b", "elsewhere")]
    )
    assert cache.job_keys() == []


def test_a_namespace_whose_pods_were_listed_whole_answers_for_every_job() -> None:
    cache = ObjectCache()
    jobs = cache.pods_listed("a", Listing([pod("kept", "kept-worker-0", "7")], "20"))
    assert jobs == [("a", "kept")]
    assert [p["metadata"]["name"] for p in cache.pods(("a", "kept")) or []] == ["kept-worker-0"]
    assert cache.pods(("a", "idle")) == []  # listed whole: no pods is an answer
    assert cache.pods(("b", "elsewhere")) is None
    cache.pods_listed(None, Listing([], "40"))
    assert cache.pods(("c", "anything")) == []


def test_a_deleted_job_takes_its_pods_with_it() -> None:
    cache = ObjectCache()
    cache.put_job(job("j", "1"))
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-0", "2")], "2"))
    cache.drop_job(job("j", "3"))
    assert cache.job(("a", "j")) is None and cache.pods(("a", "j")) is None


def test_a_late_deleted_event_of_the_last_gang_keeps_the_pod_of_the_same_name_now() -> None:
    cache = ObjectCache()
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-0", "9", uid="gang-1")], "9"))
    cache.drop_pod(pod("j", "j-worker-0", "5", uid="gang-0"))
    assert [p["metadata"]["uid"] for p in cache.pods(("a", "j")) or []] == ["gang-1"]
    cache.drop_pod(pod("j", "j-worker-0", "10", uid="gang-1"))
    assert cache.pods(("a", "j")) == []
    cache.put_job(job("j", "20"))  # created again under the same name after a delete
    cache.drop_job(job("j", "4"))  # the old one's DELETED, late
    assert cache.job(("a", "j")) is not None


def test_a_pod_the_operator_deleted_is_terminating_or_gone() -> None:
    cache = ObjectCache()
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-0", "2"), pod("j", "j-worker-1", "3")], "3"))
    terminating = pod("j", "j-worker-0", "4", deletionTimestamp="2026-12-02T00:00:00Z")
    cache.deleted_pod("a", "j", "j-worker-0", terminating)  # a real server: graceful deletion
    cache.deleted_pod("a", "j", "j-worker-1", {"kind": "Status", "status": "Success"})  # gone at once
    held = cache.pods(("a", "j")) or []
    assert [p["metadata"]["name"] for p in held] == ["j-worker-0"]
    assert held[0]["metadata"]["deletionTimestamp"]


def test_children_are_kept_as_watched_and_relisted() -> None:
    cache = ObjectCache()
    svc = {**pod("j", "j", "5"), "kind": "Service"}
    cache.put_child("services", svc)
    assert (cache.child("services", "a", "j") or {})["metadata"]["resourceVersion"] == "5"
    assert cache.child("serviceaccounts", "a", "j") is None  # another kind, same name
    cache.put_child("services", {**svc, "metadata": {**svc["metadata"], "resourceVersion": "3"}})  # a late answer
    assert (cache.child("services", "a", "j") or {})["metadata"]["resourceVersion"] == "5"
    cache.put_child("serviceaccounts", pod("j", "j-runtime", "6"))
    cache.forget_children(("a", "j"))  # a refused write: the retry reads them from the server
    assert cache.child("services", "a", "j") is None and cache.child("serviceaccounts", "a", "j-runtime") is None
    cache.put_child("roles", pod("j", "j-status", "2"))  # deleted during a watch gap
    cache.put_child("roles", pod("k", "k-status", "30"))  # created after the LIST
    cache.relisted_children("roles", "a", Listing([pod("m", "m-status", "4")], "20"))
    assert cache.child("roles", "a", "j-status") is None
    assert cache.child("roles", "a", "k-status") is not None and cache.child("roles", "a", "m-status") is not None
    cache.drop_child("roles", pod("m", "m-status", "25"))
    assert cache.child("roles", "a", "m-status") is None


def test_nothing_brings_back_an_object_seen_deleted() -> None:
    cache = ObjectCache()
    cache.known_pods(("a", "j"), Listing([pod("j", "j-worker-0", "2", uid="p0")], "2"))
    # The pod's DELETED event comes before the answer to the operator's DELETE (removed at once: never scheduled).
    cache.drop_pod(pod("j", "j-worker-0", "5", uid="p0"))
    cache.deleted_pod("a", "j", "j-worker-0", pod("j", "j-worker-0", "4", uid="p0", deletionTimestamp="t"))
    assert cache.pods(("a", "j")) == []
    cache.put_pod(pod("j", "j-worker-0", "3", uid="p0"))  # a create's answer, later still
    assert cache.pods(("a", "j")) == []
    # A LIST whose snapshot predates a deletion it raced: the job stays gone and is not listed as present.
    cache.put_job({**job("k", "8"), "metadata": {**job("k", "8")["metadata"], "uid": "k1"}})
    cache.drop_job({**job("k", "30"), "metadata": {**job("k", "30")["metadata"], "uid": "k1"}})
    listed = {**job("k", "8"), "metadata": {**job("k", "8")["metadata"], "uid": "k1"}}
    present, _ = cache.relisted_jobs("a", Listing([listed], "20"))
    assert present == [] and cache.job(("a", "k")) is None
    cache.put_job({**job("k", "40"), "metadata": {**job("k", "40")["metadata"], "uid": "k2"}})  # created again
    assert cache.job(("a", "k")) is not None


def test_a_job_the_server_says_is_gone_leaves_even_when_a_later_version_is_held() -> None:
    cache = ObjectCache()
    held = job("j", "9")
    held["metadata"]["uid"] = "u1"
    cache.put_job(held)
    answered = job("j", "7")  # the body the pass read, older than the watch event since
    answered["metadata"]["uid"] = "u1"
    cache.drop_job(answered)
    assert cache.job(("a", "j")) is not None  # a DELETED event older than what is held: kept
    cache.drop_job(answered, whatever_version=True)
    assert cache.job(("a", "j")) is None
