"""Moving fields an older operator build wrote by create or update under the operator's server-side apply, as
client-go's `csaupgrade.UpgradeManagedFields` does.

A child an older build created by POST has its fields owned by an `Update` entry of metadata.managedFields (manager
`zerotrain-operator`, from the user agent). An apply, even forced, takes only the fields its configuration sets;
the `Update` entry keeps the others, and a field the builders no longer set would stay on the live object for good.
One JSON patch, sent once before the first apply that finds such an entry, unites the entry's fields with the
operator's `Apply` entry (or turns it into one): from then on the apply owns them, and removes those it no longer
sets. The patch tests the object's resourceVersion, so it never rewrites ownership of a version it did not read.
"""

from __future__ import annotations

from typing import Any

from zerotrain.operator.objects import Obj

APPLY = "Apply"
UPDATE = "Update"


def union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two `FieldsV1` sets (nested maps of `f:`/`k:`/`v:`/`i:` keys, `{}` at the leaves) as one."""
    out = dict(a)
    for key, value in b.items():
        out[key] = union(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def upgrade_ops(live: Obj, manager: str) -> list[Obj] | None:
    """The JSON patch moving `manager`'s `Update` entries (the object itself, not a subresource) into its `Apply`
    entry; None when `live` has none."""
    md = live.get("metadata") or {}
    entries: list[Obj] = list(md.get("managedFields") or [])

    def ours(entry: Obj, operation: str) -> bool:
        return entry.get("manager") == manager and entry.get("operation") == operation and not entry.get("subresource")

    updates = [e for e in entries if ours(e, UPDATE)]
    if not updates or not md.get("resourceVersion"):
        return None
    applied = next((e for e in entries if ours(e, APPLY)), None)
    fields: dict[str, Any] = dict((applied or {}).get("fieldsV1") or {})
    for entry in updates:
        fields = union(fields, entry.get("fieldsV1") or {})
    model = applied or updates[0]
    merged = {**model, "manager": manager, "operation": APPLY, "fieldsType": "FieldsV1", "fieldsV1": fields}
    kept = [merged if e is model else e for e in entries if e is model or not (ours(e, UPDATE) or ours(e, APPLY))]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": md["resourceVersion"]},
        {"op": "replace", "path": "/metadata/managedFields", "value": kept},
    ]
