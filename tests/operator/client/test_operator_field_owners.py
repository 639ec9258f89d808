"""Fields an older build wrote by create or update move under the operator's apply (client-go's csaupgrade): one
JSON patch, only when such an entry exists, guarded by the resourceVersion read."""

from __future__ import annotations

from typing import Any

import kubernetes

from zerotrain.operator.client.field_owners import union, upgrade_ops
from zerotrain.operator.client.kube import Kube

M = "zerotrain-operator"


def entry(manager: str, operation: str, fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields, **extra}


def live(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "s", "resourceVersion": "41", "managedFields": list(entries)}}


def test_fields_sets_unite_at_every_depth() -> None:
    a = {"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:clusterIP": {}}}
    b = {"f:metadata": {"f:labels": {"f:b": {}}}, "f:spec": {"f:sessionAffinity": {}}}
    assert union(a, b) == {
        "f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}},
        "f:spec": {"f:clusterIP": {}, "f:sessionAffinity": {}},
    }


def test_an_update_entry_joins_the_apply_entry_and_the_others_stay() -> None:
    applied = entry(M, "Apply", {"f:spec": {"f:clusterIP": {}}}, time="t1")
    older = entry(M, "Update", {"f:spec": {"f:sessionAffinity": {}}, "f:metadata": {"f:labels": {"f:old": {}}}})
    status = entry(M, "Update", {"f:status": {}}, subresource="status")
    kubectl = entry("kubectl-edit", "Update", {"f:metadata": {"f:annotations": {}}})
    ops = upgrade_ops(live(older, applied, status, kubectl), M)
    assert ops is not None and ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    kept = ops[1]["value"]
    assert ops[1]["path"] == "/metadata/managedFields" and [e["manager"] for e in kept] == [M, M, "kubectl-edit"]
    assert kept[0]["operation"] == "Apply" and kept[0]["time"] == "t1"
    assert kept[0]["fieldsV1"] == {
        "f:spec": {"f:clusterIP": {}, "f:sessionAffinity": {}},
        "f:metadata": {"f:labels": {"f:old": {}}},
    }
    assert kept[1] is status and kept[2] is kubectl  # a subresource's entry and other managers' are not ours to move


def test_an_update_entry_alone_becomes_the_apply_entry() -> None:
    older = entry(M, "Update", {"f:spec": {"f:sessionAffinity": {}}}, time="t0")
    ops = upgrade_ops(live(older), M)
    assert ops is not None
    assert ops[1]["value"] == [{**older, "operation": "Apply"}]


def test_nothing_is_sent_without_an_update_entry_of_the_operator() -> None:
    assert upgrade_ops(live(entry(M, "Apply", {"f:spec": {}})), M) is None
    assert upgrade_ops(live(entry("someone-else", "Update", {"f:spec": {}})), M) is None
    assert upgrade_ops({"metadata": {"name": "s"}}, M) is None  # the emulator keeps no managedFields


class Recording(Kube):
    """A client whose server answers every apply with `answers` in turn, recording what it was sent."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        super().__init__(kubernetes.client.Configuration())
        self.answers = answers
        self.sent: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str = "", **_: Any) -> Any:
        self.sent.append((method, content_type))
        return self.answers.pop(0) if content_type.startswith("application/apply") else {}


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "n"}, "spec": {}}
APPLIED = entry(M, "Apply", {"f:spec": {}})
APPLY = ("PATCH", "application/apply-patch+yaml")
MOVE = ("PATCH", "application/json-patch+json")


def test_with_no_copy_the_answer_shows_an_older_builds_fields_and_the_apply_goes_again() -> None:
    # A PodGroup is not cached: the first apply's answer is where the Update entry shows.
    kube = Recording([live(APPLIED, entry(M, "Update", {"f:metadata": {}})), live(APPLIED)])
    assert kube.apply(SERVICE) == live(APPLIED)
    assert kube.sent == [APPLY, MOVE, APPLY]


def test_with_no_copy_and_no_older_fields_one_apply_is_all() -> None:
    kube = Recording([live(APPLIED)])
    kube.apply(SERVICE)
    assert kube.sent == [APPLY]


def test_a_cached_copy_with_an_older_builds_fields_moves_them_before_the_one_apply() -> None:
    kube = Recording([live(APPLIED)])
    kube.apply(SERVICE, known=live(entry(M, "Update", {"f:spec": {}})))
    assert kube.sent == [MOVE, APPLY]
