"""A refused child write (403, 404, 422, quota...) as the job's `ChildWriteFailed` condition: a specific reason, the
server's own message and the fix, so the job's status says what only the operator log said before.

Pure: the reconciler catches the error, and this turns it into status. The condition stays True (one Warning
Event, not one per retry) while retries with back-off keep failing, and turns False once a pass writes every child.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from zerotrain.job_status import ZeroTrainingJobStatus
from zerotrain.operator.client.kube import KubeError
from zerotrain.operator.controller.conditions import ConditionType, is_true, set_condition


class FailureReason:
    """Reasons of the ChildWriteFailed condition (CamelCase, machine-readable)."""

    FORBIDDEN = "Forbidden"
    QUOTA_EXCEEDED = "QuotaExceeded"
    NAMESPACE_NOT_FOUND = "NamespaceNotFound"
    RESOURCE_NOT_INSTALLED = "ResourceNotInstalled"
    NOT_FOUND = "NotFound"
    INVALID = "Invalid"
    CONFLICT = "Conflict"
    SERVER_ERROR = "ServerError"
    WRITES_SUCCEEDED = "ChildrenWritten"


@dataclass  # not frozen: raising sets __traceback__ and __cause__ on the instance
class ChildWriteError(Exception):
    """The API server refused a write of one of the job's children."""

    verb: str
    """create, patch or delete."""
    kind: str
    """Kind of the child, e.g. Pod."""
    api_version: str
    """Its apiVersion."""
    name: str
    """Its name."""
    error: KubeError
    """The server's answer."""

    def __str__(self) -> str:
        return f"{self.verb} {self.kind} {self.name}: {self.error}"


def classify(err: ChildWriteError) -> tuple[str, str]:
    """(reason, fix) for a refused write."""
    e, msg = err.error, err.error.message.lower()
    if e.status == 403 and "exceeded quota" in msg:
        return FailureReason.QUOTA_EXCEEDED, "raise the namespace's ResourceQuota or lower spec.resources"
    if e.status == 403:
        return FailureReason.FORBIDDEN, (
            "grant the operator's ServiceAccount this permission (the Helm chart's rbac.* values; see docs/install.md)"
        )
    if e.status == 404 and "namespaces" in msg and "not found" in msg:
        return FailureReason.NAMESPACE_NOT_FOUND, "the namespace is gone or terminating; recreate the job elsewhere"
    # A server-side apply creates what is missing: its 404, like a create's, is the kind not served.
    if e.status == 404 and (e.method == "POST" or err.verb in ("create", "apply")):
        return FailureReason.RESOURCE_NOT_INSTALLED, (
            f"the cluster does not serve {err.api_version} {err.kind}: install its CRD or, for a PodGroup, set "
            "spec.scheduling.gang to none or to the gang scheduler the cluster runs"
        )
    if e.status == 404:
        return FailureReason.NOT_FOUND, "the object vanished during the write; the next pass retries"
    if e.status == 422:
        return FailureReason.INVALID, "fix the field the server names in the job's spec"
    if e.status == 409:
        return FailureReason.CONFLICT, "another writer changed the object; the next pass retries"
    return FailureReason.SERVER_ERROR, "the API server failed; the operator retries with back-off"


def failed_status(previous: ZeroTrainingJobStatus | None, err: ChildWriteError, now: datetime) -> ZeroTrainingJobStatus:
    """The previous status (nothing the failed pass decided is true yet) with ChildWriteFailed set."""
    st = (previous or ZeroTrainingJobStatus()).model_copy(deep=True)
    reason, fix = classify(err)
    set_condition(st, ConditionType.CHILD_WRITE_FAILED, True, reason, f"{err}; {fix}", now)
    return st


def clear(st: ZeroTrainingJobStatus, now: datetime) -> None:
    """Every child write of this pass went through: a ChildWriteFailed condition turns False."""
    if is_true(st, ConditionType.CHILD_WRITE_FAILED):
        set_condition(
            st, ConditionType.CHILD_WRITE_FAILED, False, FailureReason.WRITES_SUCCEEDED, "children written", now
        )
