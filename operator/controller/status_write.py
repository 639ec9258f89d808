"""The job's status as read from and written to the server: the status a pass read, and the patch from it to the
status the pass settled on, applied only to the job the pass read."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from zerotrain.job_status import ZeroTrainingJobStatus

log = logging.getLogger(__name__)
# Status fields written by the runtime's rank 0 (runtime.status_report), never by the operator.
RUNTIME_OWNED = ("step", "lastCheckpoint", "lastEvaluation", "stragglers", "gangClock")


def read_status(body: dict[str, Any]) -> ZeroTrainingJobStatus | None:
    """The job's status as last written, ignoring fields others keep there (kopf's progress)."""
    raw = body.get("status") or {}
    known = {f.alias or n for n, f in ZeroTrainingJobStatus.model_fields.items()}
    try:
        return ZeroTrainingJobStatus.model_validate({k: v for k, v in raw.items() if k in known}) if raw else None
    except ValidationError:
        log.warning("status of %s is unreadable; rebuilding it", body.get("metadata", {}).get("name"))
        return None


def status_patch(previous: ZeroTrainingJobStatus | None, new: ZeroTrainingJobStatus) -> dict[str, Any] | None:
    """The merge patch from previous to new status, or None when nothing changed."""
    before = {k: v for k, v in (previous.to_wire() if previous else {}).items() if k not in RUNTIME_OWNED}
    after = {k: v for k, v in new.to_wire().items() if k not in RUNTIME_OWNED}
    if before == after:
        return None
    return {**{k: None for k in before if k not in after}, **after}


def status_ops(uid: str | None, held: object, patch: dict[str, Any]) -> list[dict[str, Any]]:
    """`patch` (status_patch's) as a JSON patch onto `held`, the status the pass read, applied only to the job the
    pass read: its first op tests the uid, so a job deleted and created again under the same name meanwhile is
    refused (422) instead of taking the old one's status. (A uid in a merge patch is no such precondition on a
    status subresource: the server keeps the stored metadata, whatever the patch says.) The runtime's fields are
    left as they are, except on the first write, which sets the whole status before any rank has run."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
    if not isinstance(held, dict):  # no status yet: a member of it cannot be added
        return [*ops, {"op": "add", "path": "/status", "value": {k: v for k, v in patch.items() if v is not None}}]
    for k, v in patch.items():
        path = "/status/" + k.replace("~", "~0").replace("/", "~1")
        if v is not None:
            ops.append({"op": "add", "path": path, "value": v})  # add replaces a member that exists
        elif k in held:
            ops.append({"op": "remove", "path": path})
    return ops
