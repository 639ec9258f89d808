"""Admission through Kueue: a job labelled `kueue.x-k8s.io/queue-name` runs its gang as a Kueue plain pod group.

Every pod of a gang carries the queue label, the group name (one group, so one Kueue Workload, per gang) and the
group's size; Kueue's pod webhook holds the pods with its `kueue.x-k8s.io/admission` scheduling gate until the
whole group is admitted against the queue's quota, so the gang starts together or not at all. Before creating a
gang the operator checks the LocalQueue exists: without Kueue (or the queue) the pods would never be admitted,
so it creates none and says why in the job's `Queued` condition.
"""

from __future__ import annotations

from zerotrain.operator.objects import Obj

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""A job's WorkloadPriorityClass, copied to its pods: Kueue reads it there for the gang's Workload."""
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
"""'false' on a gang's pods: no pod of a group is ever replaced within it (a restart is a new group), so Kueue may
finish the group's Workload, release its quota and its pods' finalizers once none of them runs. Without it Kueue
waits for replacements that never come: measured on the real Kueue, a deleted job's pods stayed Terminating."""
ADMISSION_GATE = "kueue.x-k8s.io/admission"
API = "kueue.x-k8s.io/v1beta1"


def group_name(job: str, gang: int) -> str:
    return f"{job}-gang-{gang}"


def pod_labels(queue: str, job: str, gang: int, priority_class: str | None = None) -> dict[str, str]:
    labels = {QUEUE_LABEL: queue, GROUP_LABEL: group_name(job, gang)}
    return labels | ({PRIORITY_LABEL: priority_class} if priority_class else {})


def pod_annotations(replicas: int) -> dict[str, str]:
    return {COUNT_ANNOTATION: str(replicas), RETRIABLE_ANNOTATION: "false"}


def is_gated(pod: Obj) -> bool:
    """Kueue still holds the pod (its admission gate is on it)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def waiting_reason(workload: Obj) -> str | None:
    """What Kueue says a Workload waits for: its QuotaReserved (else Admitted) condition's reason and message while
    False, e.g. 'Pending: couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor f,
    1 more needed'."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in ("QuotaReserved", "Admitted"):
        c = conditions.get(kind)
        if c is not None and c.get("status") == "False" and (c.get("message") or c.get("reason")):
            return f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    return None


def missing_message(queue: str, namespace: str, installed: bool) -> str:
    if not installed:
        return (
            f"metadata.labels[{QUEUE_LABEL}]: got {queue!r}, but Kueue is not installed (the API server does not "
            f"serve {API}); install Kueue with its pod integration, or remove the label"
        )
    return (
        f"metadata.labels[{QUEUE_LABEL}]: LocalQueue {queue!r} does not exist in namespace {namespace!r}; create it "
        "(kubectl get localqueues), or name an existing one"
    )
