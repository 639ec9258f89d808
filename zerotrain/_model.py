"""Base pydantic model shared by every spec and config model: camelCase in YAML, unknown fields refused,
field docstrings become descriptions (and so the CRD's documentation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel


@dataclass(frozen=True)
class Rule:
    """A rule across a model's fields, stated once: the CRD carries `cel` for the API server, pydantic checks `holds`,
    and both refuse with `message`; tests/core/test_rules.py evaluates `cel` against `holds` on every rule."""

    cel: str
    """The CEL expression (over `self`, the object on the wire, camelCase) that must be true."""
    holds: Callable[[Any], bool]
    """The same predicate over the pydantic model."""
    message: str
    """What is wrong and how to fix it, naming the fields."""
    fields: tuple[str, ...] = ()
    """The model's fields (snake_case, dotted into a sub-model) whose values pydantic's error also shows."""

    def error(self, model: BaseModel) -> str:
        values = ", ".join(f"{_camel_path(f)}={_shown(_get(model, f))}" for f in self.fields)
        return f"{self.message} (got {values})" if values else self.message


def _camel_path(path: str) -> str:
    return ".".join(to_camel(p) for p in path.split("."))


def _get(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _shown(value: Any) -> str:
    return str(getattr(value, "value", value))


def _add_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(model, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [{"rule": r.cel, "message": r.message} for r in rules]


class SpecModel(BaseModel):
    """camelCase aliases, `extra="forbid"`, docstrings as field descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        json_schema_extra=_add_rules,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()
    """Cross-field rules (`Rule`): into the CRD's x-kubernetes-validations, and checked here."""

    @model_validator(mode="after")
    def _check_rules(self) -> SpecModel:
        for rule in type(self).rules:
            if not rule.holds(self):
                raise ValueError(rule.error(self))
        return self

    def to_wire(self) -> dict:
        """The camelCase dict a manifest or the API server holds, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
