"""The command reaches the runtime through one narrow module (zerotrain/commands/runtime_calls.py), and every name
it lists resolves to what it says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zerotrain.commands import runtime_calls

CORE = Path(__file__).resolve().parents[2] / "zerotrain"


def test_no_module_of_the_core_imports_the_runtime_but_the_narrow_one() -> None:
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "runtime_calls.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{path.relative_to(CORE)}:{node.lineno} {n}" for n in names if n.startswith("zerotrain.runtime")]
    assert not bad, bad


@pytest.mark.parametrize("name", runtime_calls.__all__)
def test_every_name_loads_from_its_home(name: str) -> None:
    module, attr = runtime_calls._HOMES[name]
    value = getattr(runtime_calls, name)
    assert getattr(__import__(module, fromlist=[attr]), attr) is value
