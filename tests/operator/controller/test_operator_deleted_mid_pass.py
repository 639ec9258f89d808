"""A job deleted while a reconcile pass runs: the status write meets a 404, and the series that pass set for the job
must go with it (the delete handler may already have forgotten the job, before this pass set them again). A job
deleted and created again under its name meanwhile: the write's uid test refuses it, and the new job keeps its own
status."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

import jsonpatch
import pytest
from prometheus_client import generate_latest

from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.operator.controller.reconcile import Reconciler, status_ops
from zerotrain.operator.controller.status import ZeroTrainingJobStatus, invalid
from zerotrain.operator.settings import OperatorSettings

BODY = {"metadata": {"namespace": "ns", "name": "gone", "uid": "u1"}}


class StatusWrites:
    """The one API call `_write` makes, answered with `status`."""

    def __init__(self, status: int) -> None:
        self.status = status

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        raise KubeError(self.status, "Refused", f"{namespace}/{name}", "PATCH")


def _series(r: Reconciler) -> str:
    return generate_latest(r.metrics.registry).decode()


def test_a_job_deleted_during_the_pass_leaves_no_series() -> None:
    r = Reconciler(cast(Kube, StatusWrites(404)), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    r._write(BODY, None, new)
    assert 'zerotrain_job="gone"' not in _series(r)


def test_other_refusals_of_the_status_write_still_raise_and_keep_the_series() -> None:
    r = Reconciler(cast(Kube, StatusWrites(500)), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    with pytest.raises(KubeError):
        r._write(BODY, None, new)
    assert 'zerotrain_job="gone"' in _series(r)


class OneJob:
    """A server holding one job: status writes are applied as the API server does (a failed JSON-patch test is 422)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.job

    def patch_job_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            patched = jsonpatch.apply_patch(self.job, ops)
        except jsonpatch.JsonPatchException as e:
            raise KubeError(422, "Invalid", str(e), "PATCH") from e
        self.job = {**self.job, "status": patched.get("status")}  # the status subresource writes status alone
        return self.job

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        return event


def test_a_job_created_again_under_the_name_keeps_its_own_status_and_the_old_ones_series_go() -> None:
    again = {"metadata": {"namespace": "ns", "name": "gone", "uid": "u2"}, "status": {"phase": "Pending"}}
    server = OneJob(again)
    r = Reconciler(cast(Kube, server), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    r._write(BODY, None, new)  # the pass read u1's body
    assert server.job["status"] == {"phase": "Pending"}
    assert 'zerotrain_job="gone"' not in _series(r)


def test_a_status_the_server_finds_invalid_for_the_same_job_still_raises_and_keeps_the_series() -> None:
    server = OneJob({"metadata": {"namespace": "ns", "name": "gone", "uid": "u1"}})
    invalid_status = KubeError(422, "Invalid", "status.phase: Unsupported value", "PATCH")

    def refuse(namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        raise invalid_status

    server.patch_job_status = refuse  # type: ignore[method-assign]
    r = Reconciler(cast(Kube, server), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    with pytest.raises(KubeError) as e:
        r._write(BODY, None, new)
    assert e.value is invalid_status and 'zerotrain_job="gone"' in _series(r)


def test_a_status_write_refused_against_a_stale_copy_is_sent_again_against_the_stored_one() -> None:
    # The pass's copy still shows a message the server no longer has (or its first attempt was applied, the answer
    # lost): `remove` finds nothing, and the ops are built again from what the server holds.
    stored = {"metadata": {"namespace": "ns", "name": "gone", "uid": "u1"}, "status": {"phase": "Pending"}}
    server = OneJob(stored)
    r = Reconciler(cast(Kube, server), OperatorSettings())
    held = {"phase": "Pending", "stage": 2}  # the server's status has no stage any more
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    r._write({**BODY, "status": held}, ZeroTrainingJobStatus.model_validate(held), new)
    assert server.job["status"]["phase"] == new.phase.value and "stage" not in server.job["status"]


def test_status_ops_leave_the_runtimes_fields_and_remove_only_what_is_there() -> None:
    job = {"metadata": {"uid": "u1"}, "status": {"phase": "Running", "step": 40, "reason": "x"}}
    ops = status_ops("u1", job["status"], {"phase": "Failed", "reason": None, "message": None})
    assert jsonpatch.apply_patch(job, ops)["status"] == {"phase": "Failed", "step": 40}
    first = status_ops("u1", None, {"phase": "Pending", "message": None})
    assert jsonpatch.apply_patch({"metadata": {"uid": "u1"}}, first)["status"] == {"phase": "Pending"}
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch({"metadata": {"uid": "u2"}, "status": {}}, ops)
