"""What the operator knows of its jobs and their pods, fed by watch streams (kopf's for jobs, client.reflector's for
pods and the other children).

A steady job's pass reads its body and its pods from here and sends nothing; only a key the cache has not seen
yet is read from the API server (and kept). Three things keep it true:

- every watch event (resourceVersion-resumed, re-listed on 410 Gone)
  replaces the object it names, or removes it on DELETED;
- the operator's own writes go in as the server answered them (a status patch's job, a created pod), so the pass
  right after a write does not act on what it has just changed; an answer older than what a watch event already
  brought is ignored, as client-go's MutationCache does, comparing resourceVersions as integers;
- each reflector re-lists its own kind on 410 Gone, replacing what it held; the jobs, which kopf watches and
  re-lists without a DELETED for those gone in between, get a periodic LIST of their own (`relisted_jobs`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from zerotrain.operator.client import selectors
from zerotrain.operator.client.kube import Listing
from zerotrain.operator.objects import Key, Obj

GONE_SECONDS = 600.0
"""How long a deleted object's uid is remembered, so nothing brings it back into the cache."""


def _rv(obj: Obj) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def newer(candidate: Obj, held: Obj | None) -> bool:
    """Whether `candidate` may replace `held`: not when both carry integer resourceVersions and it is older (a
    write's answer arriving after the watch event of a later change). Opaque versions: the candidate wins."""
    if held is None:
        return True
    a, b = _rv(candidate), _rv(held)
    return a is None or b is None or a >= b


def _uid(obj: Obj | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def _same_or_older(gone: Obj, held: Obj | None) -> bool:
    """Whether a DELETED object is the one held (same uid, where both have one) and not older than it."""
    if held is None:
        return True
    uid, held_uid = _uid(gone), _uid(held)
    return (uid is None or held_uid is None or uid == held_uid) and newer(gone, held)


def _key(obj: Obj) -> Key:
    md = obj.get("metadata") or {}
    return md.get("namespace", ""), md.get("name", "")


def job_of(pod: Obj) -> Key | None:
    """The job a pod belongs to (its job label), or None for a pod that is not one of ours."""
    md = pod.get("metadata") or {}
    job = (md.get("labels") or {}).get(selectors.LABEL_JOB)
    return (md.get("namespace", ""), job) if job else None


@dataclass
class ObjectCache:
    """Jobs by key and pods by job, thread-safe; returned objects are copies, so a caller cannot corrupt it."""

    _jobs: dict[Key, Obj] = field(default_factory=dict)
    _pods: dict[Key, dict[str, Obj]] = field(default_factory=dict)
    _pods_known: set[Key] = field(default_factory=set)
    """Jobs whose pod set is complete here (listed once, or in a namespace listed whole): an empty set is an
    answer, not a gap."""
    _namespaces_known: set[str] = field(default_factory=set)
    _all_known: bool = False
    _children: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    """The jobs' other children, by (plural, namespace, name): a Service, a ServiceAccount, a Role, a RoleBinding."""
    _gone: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """uids seen DELETED in the last GONE_SECONDS: a write's answer or a LIST that raced the deletion cannot bring
    the object back (client-go avoids the race by queueing LISTs and events in one DeltaFIFO)."""
    clock: Callable[[], float] = time.monotonic
    _mu: threading.Lock = field(default_factory=threading.Lock)

    def _bury(self, obj: Obj) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        now = self.clock()
        if uid:
            self._gone[uid] = now
            self._gone.move_to_end(uid)
        while self._gone and now - next(iter(self._gone.values())) > GONE_SECONDS:
            self._gone.popitem(last=False)

    def _buried(self, obj: Obj) -> bool:
        return (obj.get("metadata") or {}).get("uid") in self._gone

    # -- jobs ------------------------------------------------------------------------------------------------

    def job(self, key: Key) -> Obj | None:
        """The job as last seen, or None when the cache has never seen it (ask the server)."""
        with self._mu:
            body = self._jobs.get(key)
            return copy.deepcopy(body) if body is not None else None

    def put_job(self, body: Obj) -> None:
        with self._mu:
            key = _key(body)
            if not self._buried(body) and newer(body, self._jobs.get(key)):
                self._jobs[key] = copy.deepcopy(body)

    def drop_job(self, body: Obj, whatever_version: bool = False) -> None:
        """A DELETED event: the job and its pods (the garbage collector's, now) leave the cache, unless what it
        holds under that name is a newer job (deleted and created again). `whatever_version`: the server said 404
        for this uid, so a copy of it at a later resourceVersion goes too."""
        key = _key(body)
        with self._mu:
            self._bury(body)
            held = self._jobs.get(key)
            if not (whatever_version and _uid(body) is not None and _uid(body) == _uid(held)) and not _same_or_older(
                body, held
            ):
                return
            self._jobs.pop(key, None)
            self._pods.pop(key, None)
            self._pods_known.discard(key)

    # -- pods ------------------------------------------------------------------------------------------------

    def pods(self, key: Key) -> list[Obj] | None:
        """The job's pods by name, or None when the cache does not hold the complete set (ask the server).

        The pods are the cache's own objects, read-only to the caller, as client-go's listers hand them out: every
        pass reads all its job's pods, and copying them cost a 500-pod job 0.3-0.5 s of CPU a pass (measured on a
        real API server, where that CPU is the server's too). The cache never changes an object it holds: an event
        or an answer replaces it whole."""
        with self._mu:
            if not (self._all_known or key in self._pods_known or key[0] in self._namespaces_known):
                return None
            return [p for _, p in sorted(self._pods.get(key, {}).items())]

    def put_pod(self, pod: Obj, handed_over: bool = False) -> None:
        """A pod as a watch event or a write's answer showed it. `handed_over`: the caller made it (freshly
        decoded) and never touches it again, so it is kept as it is, not copied (a watch event's pod)."""
        job = job_of(pod)
        if job is None:
            return
        with self._mu:
            if self._buried(pod):
                return
            held = self._pods.setdefault(job, {})
            name = _key(pod)[1]
            if newer(pod, held.get(name)):
                held[name] = pod if handed_over else copy.deepcopy(pod)

    def drop_pod(self, pod: Obj) -> None:
        job = job_of(pod)
        if job is None:
            return
        with self._mu:
            self._bury(pod)
            held = self._pods.get(job, {})
            name = _key(pod)[1]
            # Pod names repeat from gang to gang: a late DELETED of the last gang's pod must not drop this one's.
            if _same_or_older(pod, held.get(name)):
                held.pop(name, None)
            if not held and job not in self._jobs:
                self._pods.pop(job, None)

    def deleted_pod(self, namespace: str, job: str, name: str, answer: Obj) -> None:
        """The operator deleted a pod: the server's answer is the pod terminating (kept until its DELETED event),
        or anything else once it is gone. It only updates the pod held, never adds one: its DELETED event may
        have come first."""
        with self._mu:
            held = self._pods.get((namespace, job), {})
            current = held.get(name)
            if current is None:
                return
            same = _uid(answer) == _uid(current)
            if (answer.get("metadata") or {}).get("deletionTimestamp") and answer.get("kind") == "Pod":
                if same and not self._buried(answer) and newer(answer, current):
                    held[name] = copy.deepcopy(answer)
            else:
                held.pop(name, None)

    def known_pods(self, key: Key, pods: Listing) -> None:
        """A LIST of one job's pods: the set is now complete (events that came while it ran are kept)."""
        with self._mu:
            fresh = {_key(p)[1]: p for p in pods.items if not self._buried(p)}
            self._replace({key: fresh}, {key}, pods.resource_version)
            self._pods_known.add(key)

    def pods_listed(self, namespace: str | None, pods: Listing) -> list[Key]:
        """A LIST of every operator pod of `namespace` (all: None), which a pod watch follows from its
        resourceVersion: the namespace's pod sets are complete from now on. Returns the jobs whose pods it held or
        listed."""
        with self._mu:
            by_job: dict[Key, dict[str, Obj]] = {}
            for pod in pods.items:
                if (job := job_of(pod)) is not None and not self._buried(pod):
                    by_job.setdefault(job, {})[_key(pod)[1]] = pod
            scope = {k for k in self._pods if namespace is None or k[0] == namespace} | by_job.keys()
            self._replace(by_job, scope, pods.resource_version)
            if namespace is None:
                self._all_known = True
            else:
                self._namespaces_known.add(namespace)
            return sorted(scope)

    # -- other children ------------------------------------------------------------------------------------

    def child(self, plural: str, namespace: str, name: str) -> Obj | None:
        """The child as last seen, or None when not seen (ask the server: an absence here proves nothing)."""
        with self._mu:
            obj = self._children.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def put_child(self, plural: str, obj: Obj, handed_over: bool = False) -> None:
        """A child as a watch event or a write's answer showed it (`handed_over`: as put_pod's)."""
        key = (plural, *_key(obj))
        with self._mu:
            if not self._buried(obj) and newer(obj, self._children.get(key)):
                self._children[key] = obj if handed_over else copy.deepcopy(obj)

    def drop_child(self, plural: str, obj: Obj) -> None:
        key = (plural, *_key(obj))
        with self._mu:
            self._bury(obj)
            if _same_or_older(obj, self._children.get(key)):
                self._children.pop(key, None)

    def forget_children(self, job: Key) -> None:
        """A write about the job was refused: its next pass reads its children from the server, not from here."""
        with self._mu:
            owned = [k for k, o in self._children.items() if k[1] == job[0] and job_of(o) == job]
            for k in owned:
                del self._children[k]

    def relisted_children(self, plural: str, namespace: str | None, listing: Listing) -> None:
        """A LIST of one kind of child: what it no longer shows (and no watch event kept) is gone."""
        with self._mu:
            listed = {(plural, *_key(o)): o for o in listing.items if not self._buried(o)}
            for k in [k for k in self._children if k[0] == plural and (namespace is None or k[1] == namespace)]:
                if k not in listed and self._older_than(self._children[k], listing.resource_version):
                    del self._children[k]
            for k, obj in listed.items():
                if newer(obj, self._children.get(k)):
                    self._children[k] = copy.deepcopy(obj)

    # -- the jobs of a namespace listed whole -------------------------------------------------------------------

    def job_keys(self) -> list[Key]:
        """Every job the cache holds: what the periodic resync asks a pass for."""
        with self._mu:
            return sorted(self._jobs)

    def relisted_jobs(self, namespace: str | None, jobs: Listing) -> tuple[list[Key], list[Key]]:
        """Replace what the cache holds of `namespace`'s jobs (every namespace: None) with a LIST of them; returns
        the jobs listed (less those deleted since) and those it held that the LIST no longer shows (gone with no
        DELETED seen: kopf re-lists after 410 Gone without one). Their pods go by the pod watch's own DELETEDs."""

        def inside(k: Key) -> bool:
            return namespace is None or k[0] == namespace

        with self._mu:
            listed = {_key(j): j for j in jobs.items if not self._buried(j)}
            held = [k for k in self._jobs if inside(k) and k not in listed]
            gone = sorted(k for k in held if self._older_than(self._jobs[k], jobs.resource_version))
            for k in gone:
                self._jobs.pop(k)
            for k, body in listed.items():
                if newer(body, self._jobs.get(k)):
                    self._jobs[k] = copy.deepcopy(body)
            return sorted(listed), gone

    def _replace(self, listed: dict[Key, dict[str, Obj]], scope: set[Key], list_rv: str | None) -> None:
        """Each job of `scope` gets the listed pods, keeping a held pod newer than the LIST (a watch event that came
        while it ran) and dropping the others it no longer shows."""
        for job in scope:
            held = self._pods.get(job, {})
            fresh = listed.get(job, {})
            kept = {n: p for n, p in held.items() if n not in fresh and not self._older_than(p, list_rv)}
            for name, pod in fresh.items():
                kept[name] = held[name] if name in held and not newer(pod, held[name]) else copy.deepcopy(pod)
            if kept or job in self._jobs:
                self._pods[job] = kept
            else:
                self._pods.pop(job, None)

    @staticmethod
    def _older_than(obj: Obj, list_rv: str | None) -> bool:
        """Whether `obj` predates a LIST at `list_rv` (so its absence there means it is gone); unknown: yes."""
        a = _rv(obj)
        b = int(list_rv) if list_rv and list_rv.isdigit() else None
        return a is None or b is None or a <= b
