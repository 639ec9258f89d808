"""Base pydantic model shared by every spec and config model: camelCase in YAML, unknown fields refused,
field docstrings become descriptions (and so the CRD's documentation)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """camelCase aliases, `extra="forbid"`, docstrings as field descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    def to_wire(self) -> dict:
        """The camelCase dict a manifest or the API server holds, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel_rules(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CRD `x-kubernetes-validations` (rule, message) pairs.

    Each rule mirrors a pydantic validator on the same model, so the API server refuses what the operator
    and `zerotrain run` refuse.
    """
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]})
