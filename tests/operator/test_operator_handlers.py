"""Which job events ask for a pass: any change a pass acts on, never a change to the status alone."""

from __future__ import annotations

import copy
from typing import Any

from zerotrain.operator.handlers import job_essence

JOB: dict[str, Any] = {
    "metadata": {"name": "j", "namespace": "a", "uid": "u1", "generation": 1, "resourceVersion": "5", "labels": {}},
    "spec": {"replicas": 2},
    "status": {"phase": "Running", "step": 10},
}


def changed(**edits: Any) -> dict[str, Any]:
    body = copy.deepcopy(JOB)
    for path, value in edits.items():
        where, key = path.split("__")
        body[where][key] = value
    return body


def test_status_and_version_changes_ask_for_no_pass() -> None:
    assert job_essence(changed(status__step=11, metadata__resourceVersion="6")) == job_essence(JOB)


def test_spec_metadata_and_identity_changes_ask_for_one() -> None:
    for edit in (
        {"spec__replicas": 4},
        {"metadata__labels": {"kueue.x-k8s.io/queue-name": "q"}},
        {"metadata__deletionTimestamp": "2026-12-03T00:00:00Z"},
        {"metadata__uid": "u2"},  # created again under the name, its DELETED missed
    ):
        assert job_essence(changed(**edit)) != job_essence(JOB), edit
