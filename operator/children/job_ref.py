"""The owning ZeroTrainingJob's identity, and the metadata every child carries: the job's labels and its owner
reference (so garbage collection removes the children with the job)."""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.operator.children import kueue, naming
from zerotrain.operator.objects import Obj
from zerotrain.spec import API_VERSION, KIND


@dataclass(frozen=True)
class JobRef:
    """Identity of the owning ZeroTrainingJob."""

    name: str
    namespace: str
    uid: str
    queue: str | None = None
    """The Kueue LocalQueue the job's label names (`kueue.x-k8s.io/queue-name`), if any."""
    priority_class: str | None = None
    """The Kueue WorkloadPriorityClass the job's label names (`kueue.x-k8s.io/priority-class`), if any."""

    @classmethod
    def from_body(cls, body: Obj) -> JobRef:
        md = body.get("metadata", {})
        labels = md.get("labels") or {}
        queue = labels.get(kueue.QUEUE_LABEL) or None
        priority = labels.get(kueue.PRIORITY_LABEL) or None
        return cls(md["name"], md["namespace"], md.get("uid", ""), queue, priority)


def owner_reference(job: JobRef) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: JobRef, name: str, extra_labels: dict[str, str] | None = None) -> Obj:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**naming.job_labels(job.name), **(extra_labels or {})},
        "ownerReferences": [owner_reference(job)],
    }
