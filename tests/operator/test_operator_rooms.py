"""The operator's rooms import one way: controller → children → client, never back. The client, the one room that
talks to the API server, knows the children only by the labels it finds them with (operator/client/selectors.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
ORDER = ("controller", "children", "client")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("room", ORDER[1:])
def test_a_room_imports_no_room_above_it(room: str) -> None:
    above = ORDER[: ORDER.index(room)]
    bad = [
        f"{path.relative_to(OPERATOR)} imports {module}"
        for path in sorted((OPERATOR / room).glob("*.py"))
        for module in imported(path)
        if any(module.startswith(f"zerotrain.operator.{r}") for r in above)
    ]
    assert not bad, bad
