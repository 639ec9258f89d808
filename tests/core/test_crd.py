"""The committed CRD is generated from the models, structural, and its CEL rules agree with pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from pydantic import ValidationError
from test_rules import BASE, CASES  # one set of cases for every rule test

from zerotrain.crd import CRD_FILENAME, build_crd, render_crd_yaml
from zerotrain.spec import ZeroTrainingJobSpec

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_is_in_sync() -> None:
    committed = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert committed == render_crd_yaml(), "crds/ is stale: run `zerotrain crd` and commit the result"


def walk(node: Any, path: str = "") -> Any:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            yield from walk(value, f"{path}.{key}")
        if "items" in node:
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    for banned in ("$ref", "anyOf", "oneOf", "allOf", "prefixItems", "const:", "title:"):
        assert banned not in text
    for path, node in walk(schema):
        # Structural: every node has a type, except the two extensions that stand for one.
        untyped = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or untyped, f"{path} has no type"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
        if node.get("type") in ("object", "array") or path.endswith((".spec", ".status")):
            continue
        assert "description" in node or path.count(".") <= 1 or "[]" in path or "{}" in path, f"{path} undocumented"


def test_the_stage_is_an_int_or_the_string_auto() -> None:
    stage = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    stage = stage["properties"]["zero"]["properties"]["stage"]
    assert stage["x-kubernetes-int-or-string"] is True and stage["enum"] == [0, 1, 2, 3, "auto"]
    assert stage["default"] == 3


def test_the_shard_group_is_a_count_or_the_string_pod() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    group = spec["properties"]["zero"]["properties"]["shardGroupSize"]
    assert group["x-kubernetes-int-or-string"] is True and "enum" not in group and "default" not in group
    for bad in ("node", 0, True):
        with pytest.raises(ValidationError, match="shardGroupSize"):
            ZeroTrainingJobSpec.model_validate({**BASE, "zero": {"shardGroupSize": bad}})


def test_names_columns_and_status_subresource() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ZeroTrainingJob", "zerotrainingjobs", ["ztj"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Stage", "Ranks", "World", "Step", "Done", "ETA", "Restarts", "Age"]


def cel_rules() -> list[tuple[str, str, str]]:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return [
        (path, r["rule"], r["message"])
        for path, node in walk(schema, "spec")
        for r in node.get("x-kubernetes-validations", [])
        if "oldSelf" not in r["rule"]  # transition rules (immutability) are tested in tests/operator
    ]


def at(doc: dict[str, Any], path: str) -> Any:
    for part in path.split(".")[1:]:
        doc = doc[part]
    return doc


@pytest.mark.parametrize("patch", CASES)
def test_cel_rules_agree_with_pydantic(patch: dict[str, Any]) -> None:
    """Each CEL rule compiles, and the API server would refuse exactly what pydantic refuses."""
    doc = {**BASE, **patch}
    try:
        ZeroTrainingJobSpec.model_validate(doc)
        pydantic_ok = True
    except ValidationError:
        pydantic_ok = False
    env = celpy.Environment()
    cel_ok = True
    for path, rule, _ in cel_rules():
        try:
            target = at(doc, path)
        except KeyError:
            continue  # the apiserver only evaluates rules on objects that are present
        if not env.program(env.compile(rule)).evaluate({"self": celpy.json_to_cel(target)}):
            cel_ok = False
    assert cel_ok == pydantic_ok


def test_every_cel_rule_is_exercised() -> None:
    assert len(cel_rules()) >= 5


@pytest.mark.parametrize("version", ["1.27.0", "latest"])
def test_crd_is_a_valid_customresourcedefinition(version: str) -> None:
    """Strict schema validation of the CRD object itself (no API server here to apply it to)."""
    import kubernetes_validate

    target = kubernetes_validate.latest_version() if version == "latest" else version
    kubernetes_validate.validate(build_crd(), target, strict=True)
