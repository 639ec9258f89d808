"""The reads and writes of a reconcile pass, through the operator's cache.

Reads come from the cache (operator.client.cache) when it holds the answer and from the server otherwise (kept for the
next pass); writes go to the server and their answers into the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.operator.client.api_calls import CACHED_CHILDREN
from zerotrain.operator.client.cache import ObjectCache
from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.operator.objects import Key, Obj


@dataclass
class CachedClient:
    """`kube` for every request, `cache` for what the watches have shown."""

    kube: Kube
    cache: ObjectCache

    def job(self, namespace: str, name: str) -> Obj | None:
        """The job from the cache, else from the server; None when it is gone."""
        if (body := self.cache.job((namespace, name))) is not None:
            return body
        body = self.kube.get_job(namespace, name)
        if body is not None:
            self.cache.put_job(body)
        return body

    def gone(self, body: Obj) -> None:
        """The server answered 404 for this job: it goes from the cache, uid and all."""
        self.cache.drop_job(body, whatever_version=True)

    def pods(self, namespace: str, name: str) -> list[Obj]:
        """The job's pods from the cache once it holds their complete set, else from a LIST (which completes it).
        Read-only: they are the cache's own objects (`ObjectCache.pods`)."""
        if (pods := self.cache.pods((namespace, name))) is not None:
            return pods
        listing = self.kube.list_job_pods(namespace, name)
        self.cache.known_pods((namespace, name), listing)
        return listing.items

    def patch_job_status(self, namespace: str, name: str, ops: list[Obj]) -> None:
        stored = self.kube.patch_job_status(namespace, name, ops)
        if (stored.get("metadata") or {}).get("name") == name:
            self.cache.put_job(stored)  # the next pass starts from what this one wrote, not from before it

    def apply(self, obj: Obj) -> None:
        """Server-side apply a child, unless the cache's copy (where the operator watches its kind) shows this
        configuration applied and in place."""
        plural, md = self.kube.plural_of(obj), obj["metadata"]
        watched = (obj["apiVersion"], plural) in CACHED_CHILDREN
        known = self.cache.child(plural, md["namespace"], md["name"]) if watched else None
        answer = self.kube.apply(obj, known)
        if watched and answer is not None:
            self.cache.put_child(plural, answer)

    def create_pod(self, pod: Obj) -> None:
        try:
            created = self.kube.create(pod)
        except KubeError as e:
            if e.status == 409 and e.retried:
                return  # an attempt that timed out or failed in transit created it (the watch brings it)
            raise
        self.cache.put_pod(created, handed_over=True)  # the server's answer, decoded for this call alone

    def delete_pod(self, namespace: str, job: str, name: str) -> None:
        answer = self.kube.delete_pod(namespace, name)
        self.cache.deleted_pod(namespace, job, name, answer)

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> None:
        """Merge-patch a pod's metadata; its answer goes into the cache (a pod gone meanwhile: nothing to do)."""
        try:
            stored = self.kube.patch_pod(namespace, name, patch)
        except KubeError as e:
            if e.status == 404:
                return
            raise
        self.cache.put_pod(stored, handed_over=True)

    def refused(self, job: Key) -> None:
        """A write about the job was refused: what the cache holds of its children may be why, so the retry reads
        them from the server."""
        self.cache.forget_children(job)

    def relist_jobs(self, namespaces: list[str]) -> list[Key]:
        """LIST every job of `namespaces` (all: empty) into the cache, one request per namespace; returns those it
        held that are gone (no DELETED seen)."""
        gone: list[Key] = []
        scopes: list[str | None] = list(namespaces) or [None]
        for namespace in scopes:
            gone += self.cache.relisted_jobs(namespace, self.kube.list_jobs(namespace))[1]
        return gone
