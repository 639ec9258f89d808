"""Generate the ZeroTrainingJob CustomResourceDefinition from the pydantic models.

CRD schemas must be structural OpenAPI v3.0: no `$ref`, no `anyOf` of types, `nullable` instead of a
null type, boolean `exclusiveMinimum`. This module rewrites pydantic's JSON Schema into that form.
"""

from __future__ import annotations

from typing import Any

import yaml

from zerotrain.spec import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ZeroTrainingJobSpec,
    ZeroTrainingJobStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILENAME = f"{CRD_NAME}.yaml"

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Stage", "type": "integer", "jsonPath": ".status.stage", "description": "the ZeRO stage in force"},
    {"name": "Ranks", "type": "integer", "jsonPath": ".status.ranks.running", "description": "ranks running"},
    {
        "name": "World",
        "type": "integer",
        "jsonPath": ".status.ranks.total",
        "description": "the gang's world size in force (an elastic job's moves between its bounds)",
    },
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Done", "type": "number", "jsonPath": ".status.progress.percent", "description": "steps done, per cent"},
    {
        "name": "ETA",
        "type": "string",
        "jsonPath": ".status.progress.eta",
        "description": "training time left at the goodput ledger's training rate",
    },
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "$defs", "prefixItems"}


def structural(schema: dict[str, Any], defs: dict[str, Any], keep_defaults: bool = True) -> dict[str, Any]:
    """Inline `$ref`s and rewrite JSON Schema 2020-12 constructs into CRD-legal OpenAPI v3.0."""
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **node}  # the field's own description wins over the class docstring
        return structural(merged, defs, keep_defaults)
    nullable = False
    if "anyOf" in node and (int_or_string := _int_or_string(node["anyOf"], defs)) is not None:
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, **int_or_string}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        nullable = len(options) == 1
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {options} structurally")
        node = {**structural(options[0], defs, keep_defaults), **node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "default" and (value is None or not keep_defaults):
            continue
        if key == "properties":
            out[key] = {k: structural(v, defs, keep_defaults) for k, v in value.items()}
        elif key == "items":
            out[key] = structural(value, defs, keep_defaults)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out[key] = structural(value, defs, keep_defaults)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if "prefixItems" in node:  # fixed-length tuple of one type, e.g. Adam betas
        kinds = {p.get("type") for p in node["prefixItems"]}
        out["items"] = {"type": kinds.pop() if len(kinds) == 1 else "number"}
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if nullable:
        out["nullable"] = True
    return out


def _int_or_string(options: list[dict[str, Any]], defs: dict[str, Any]) -> dict[str, Any] | None:
    """An integer enum or a string enum (`zero.stage`: 0-3 or "auto") as the one structural form Kubernetes has
    for it: `x-kubernetes-int-or-string` with both enums' values, which the API server checks."""
    resolved = [defs[o["$ref"].split("/")[-1]] if "$ref" in o else o for o in options]
    # An unset optional field is left out (never null on the wire), so null needs no place in the schema.
    resolved = [o for o in resolved if o.get("type") != "null"]
    if sorted(str(o.get("type")) for o in resolved) != ["integer", "string"]:
        return None
    # An enum only when both sides have one (`zero.shardGroupSize`: any count, or "pod"; a CEL rule checks it).
    closed = all("enum" in o for o in resolved)
    values = [v for o in sorted(resolved, key=lambda o: str(o["type"])) for v in o.get("enum", [])]
    return {
        "x-kubernetes-int-or-string": True,
        **({"enum": values} if closed and values else {}),
    }


def model_schema(model: Any, keep_defaults: bool) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}), keep_defaults)


def build_crd() -> dict[str, Any]:
    """The CRD object."""
    spec = model_schema(ZeroTrainingJobSpec, keep_defaults=True)
    # Status is written only by the operator: server defaults there would invent observations.
    status = model_schema(ZeroTrainingJobStatus, keep_defaults=False)
    root = {
        "type": "object",
        "description": "A ZeRO data-parallel training job: a gang of pods running the zerotrain runtime.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "zerotrain"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["all", "zerotrain"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the YAML committed under crds/ (generated; do not edit by hand)."""
    header = "# Generated by `zerotrain crd` from zerotrain/spec.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
