"""User-facing errors: every message names the field, the value and the fix."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

# Exit status for refused input, as argparse uses.
EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Bad input a user can fix; the CLI prints it and exits with status 2."""


def _path(loc: tuple[Any, ...], prefix: str) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out or "(top level)"


def _known_fields(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """camelCase field names of the model at `loc` (the parent of an unknown field)."""
    current: Any = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", {})
        match = next((f for n, f in fields.items() if part in (n, f.alias)), None)
        if match is None:
            return []
        ann = match.annotation
        current = next(
            (a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
    if current is None:
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


_FIXES = {
    "greater_than_equal": "set it to at least {ge}",
    "greater_than": "set it to more than {gt}",
    "less_than_equal": "set it to at most {le}",
    "less_than": "set it to less than {lt}",
    "missing": "add it",
    "string_pattern_mismatch": "use a value matching {pattern}",
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
}


def describe_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per problem: `field: got VALUE; PROBLEM; FIX`."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = _path(loc, prefix)
        value = e.get("input")
        kind = e["type"]
        msg = e["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            known = _known_fields(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean {close[0]!r}? " if close else ""
            lines.append(f"{field}: unknown field; {fix}remove it or use one of: {', '.join(known)}")
            continue
        if kind == "enum":
            fix = "set it to one of those"
        elif kind == "missing":
            lines.append(f"{field}: required field is missing; add it")
            continue
        else:
            template = _FIXES.get(kind, "")
            fix = template.format(**e.get("ctx", {})) if template else ""
        # A cross-field rule on a whole object names the values it read: the object itself would be noise.
        shown = "" if kind == "missing" or isinstance(value, dict) else f"got {value!r}; "
        lines.append(f"{field}: {shown}{msg}" + (f"; {fix}" if fix and fix not in msg else ""))
    return "\n".join(lines)


class ConfigError(UserError):
    """The job's configuration cannot run: found in a rank or a launcher (the entry point, the device, the
    optimizer), which exits with status 2, a permanent failure the operator reports as InvalidConfig."""
