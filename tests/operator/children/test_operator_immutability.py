"""Immutable spec fields: the CRD's CEL transition rules refuse a change and allow an unchanged value."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from zerotrain.crd import build_crd

IMMUTABLE = {"entrypoint", "args", "model", "checkpoint"}  # as documented in docs/operator.md
VALUES: dict[str, tuple[Any, Any]] = {
    "entrypoint": ("pkg.mod:build", "pkg.mod:other"),
    "args": (["--a"], ["--b"]),
    "model": ({"parameters": 10}, {"parameters": 20}),
    "checkpoint": ({"path": "/c", "claimName": "x"}, {"path": "/c", "claimName": "y"}),
}


def transition_rules() -> dict[str, list[str]]:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return {
        name: [r["rule"] for r in node.get("x-kubernetes-validations", []) if "oldSelf" in r["rule"]]
        for name, node in spec.items()
        if any("oldSelf" in r["rule"] for r in node.get("x-kubernetes-validations", []))
    }


def test_exactly_the_documented_fields_are_immutable() -> None:
    assert set(transition_rules()) == IMMUTABLE


@pytest.mark.parametrize("field", sorted(IMMUTABLE))
def test_rule_refuses_change_and_allows_same(field: str) -> None:
    env = celpy.Environment()
    old, new = VALUES[field]
    for rule in transition_rules()[field]:
        program = env.program(env.compile(rule))
        same = program.evaluate({"self": celpy.json_to_cel(old), "oldSelf": celpy.json_to_cel(old)})
        changed = program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)})
        assert bool(same) and not bool(changed)
