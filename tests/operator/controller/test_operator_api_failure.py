"""Refused child writes as status: the reason a server's answer maps to, and the condition's life cycle."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from zerotrain.operator.client.kube import KubeError
from zerotrain.operator.controller.api_failure import ChildWriteError, classify, clear, failed_status
from zerotrain.operator.controller.conditions import ConditionType, get_condition
from zerotrain.operator.controller.job_events import transitions

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def err(status: int, message: str, verb: str = "create", method: str = "POST", kind: str = "Pod") -> ChildWriteError:
    return ChildWriteError(verb, kind, "v1", "llm-worker-0", KubeError(status, "X", message, method))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (err(403, 'pods "a" is forbidden: User "u" cannot create resource "pods"'), "Forbidden"),
        (err(403, 'pods "a" is forbidden: exceeded quota: q, requested: cpu=2'), "QuotaExceeded"),
        (err(404, 'namespaces "team-a" not found'), "NamespaceNotFound"),
        (
            err(404, "the server could not find the requested resource", "apply", "PATCH", "PodGroup"),
            "ResourceNotInstalled",
        ),
        (err(404, 'pods "a" not found', "delete", "DELETE"), "NotFound"),
        (err(422, 'Pod "a" is invalid: spec.containers[0].image: Required value'), "Invalid"),
        (err(409, "the object has been modified", "apply", "PATCH"), "Conflict"),
        (err(500, "etcdserver: request timed out"), "ServerError"),
    ],
)
def test_each_refusal_has_its_reason(error: ChildWriteError, reason: str) -> None:
    assert classify(error)[0] == reason


def test_the_condition_names_child_message_and_fix_warns_once_and_clears() -> None:
    e = err(403, "exceeded quota: gpus")
    first = failed_status(None, e, NOW)
    cond = get_condition(first, ConditionType.CHILD_WRITE_FAILED)
    assert cond is not None and cond.status == "True" and cond.reason == "QuotaExceeded"
    assert cond.message is not None
    assert cond.message.startswith("create Pod llm-worker-0: 403 X: exceeded quota: gpus; raise the namespace's")
    assert [(ev.type, ev.reason) for ev in transitions(None, first)] == [("Warning", "QuotaExceeded")]
    again = failed_status(first, e, NOW)
    assert transitions(first, again) == [], "a retry that fails the same way posts no second Event"
    fixed = again.model_copy(deep=True)
    clear(fixed, NOW)
    cond = get_condition(fixed, ConditionType.CHILD_WRITE_FAILED)
    assert cond is not None and (cond.status, cond.reason) == ("False", "ChildrenWritten")
    assert [ev.type for ev in transitions(again, fixed)] == ["Normal"]
