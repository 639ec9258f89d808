"""The operator's rooms import one way: controller → children → client, never back. The client, the one room that
talks to the API server, knows the children only by the labels it finds them with (operator/client/selectors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rooms import imports_above

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
ORDER = ("controller", "children", "client")


@pytest.mark.parametrize("room", ORDER[1:])
def test_a_room_imports_no_room_above_it(room: str) -> None:
    bad = [f"{path} imports {module}" for path, module in imports_above(OPERATOR, "zerotrain.operator", ORDER, room)]
    assert not bad, bad
