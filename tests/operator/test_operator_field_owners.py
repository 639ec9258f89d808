"""Fields an older build wrote by create or update move under the operator's apply (client-go's csaupgrade): one
JSON patch, only when such an entry exists, guarded by the resourceVersion read."""

from __future__ import annotations

from typing import Any

from zerotrain.operator.client.field_owners import union, upgrade_ops

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
