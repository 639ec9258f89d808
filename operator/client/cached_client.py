"""The reads and writes of a reconcile pass, through the operator's cache where it has one.

Reads come from the cache (operator.client.cache) when it holds the answer and from the server otherwise (kept for the
next pass); writes go to the server and their answers into the cache. Without a cache (tests that drive the
Reconciler alone, with no watch to feed one) every read goes to the server, as before the cache existed.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.operator.client.api_calls import CACHED_CHILDREN
from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.operator.objects import Key, Obj


@dataclass
class CachedClient:
    """`kube` for every request, `cache` (may be None) for what the watches have shown."""

    kube: Kube
    cache: ObjectCache | None

    def job(self, namespace: str, name: str) -> Obj | None:
        """The job from the cache, else from the server; None when it is gone."""
        if self.cache is not None and (body := self.cache.job((namespace, name))) is not None:
            return body
        body = self.kube.get_job(namespace, name)
        if body is not None and self.cache is not None:
            self.cache.put_job(body)
        return body

    def gone(self, body: Obj) -> None:
        """The server answered 404 for this job: it goes from the cache, uid and all."""
        if self.cache is not None:
            self.cache.drop_job(body, whatever_version=True)

    def pods(self, namespace: str, name: str) -> list[Obj]:
        """The job's pods from the cache once it holds their complete set, else from a LIST (which completes it).
        Read-only: they are the cache's own objects (`ObjectCache.pods`)."""
        if self.cache is not None and (pods := self.cache.pods((namespace, name))) is not None:
            return pods
        listing = self.kube.list_job_pods(namespace, name)
        if self.cache is not None:
            self.cache.known_pods((namespace, name), listing)
        return listing.items

    def patch_job_status(self, namespace: str, name: str, ops: list[Obj]) -> None:
        stored = self.kube.patch_job_status(namespace, name, ops)
        if self.cache is not None and (stored.get("metadata") or {}).get("name") == name:
            self.cache.put_job(stored)  # the next pass starts from what this one wrote, not from before it

    def apply(self, obj: Obj) -> None:
        """Server-side apply a child, unless the cache's copy (where the operator watches its kind) shows this
        configuration applied and in place."""
        plural, md = self.kube.plural_of(obj), obj["metadata"]
        watched = self.cache is not None and (obj["apiVersion"], plural) in CACHED_CHILDREN
        known = self.cache.child(plural, md["namespace"], md["name"]) if watched and self.cache else None
        answer = self.kube.apply(obj, known)
        if watched and self.cache is not None and answer is not None:
            self.cache.put_child(plural, answer)

    def create_pod(self, pod: Obj) -> None:
        try:
            created = self.kube.create(pod)
        except KubeError as e:
            if e.status == 409 and e.retried:
                return  # an attempt that timed out or failed in transit created it (the watch brings it)
            raise
        if self.cache is not None:
            self.cache.put_pod(created, handed_over=True)  # the server's answer, decoded for this call alone

    def delete_pod(self, namespace: str, job: str, name: str) -> None:
        answer = self.kube.delete_pod(namespace, name)
        if self.cache is not None:
            self.cache.deleted_pod(namespace, job, name, answer)

    def refused(self, job: Key) -> None:
        """A write about the job was refused: what the cache holds of its children may be why, so the retry reads
        them from the server."""
        if self.cache is not None:
            self.cache.forget_children(job)

    def relist(self, namespaces: list[str]) -> tuple[list[Key], list[Key]]:
        """LIST every job, operator pod and cached child of `namespaces` (all: empty) into the cache, one request per
        kind and namespace; returns the jobs listed and those the cache held that are gone (no DELETED seen)."""
        present: list[Key] = []
        gone: list[Key] = []
        scopes: list[str | None] = list(namespaces) or [None]
        for namespace in scopes:
            jobs = self.kube.list_jobs(namespace)
            if self.cache is None:
                present += [(j["metadata"].get("namespace", ""), j["metadata"]["name"]) for j in jobs.items]
                continue
            listed, missing = self.cache.relisted(namespace, jobs, self.kube.list_operator_pods(namespace))
            present += listed
            gone += missing
            for kind in CACHED_CHILDREN:
                self.cache.relisted_children(kind[1], namespace, self.kube.list_owned(kind, namespace))
        return present, gone
