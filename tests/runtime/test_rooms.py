"""The runtime's rooms import one way (docs/architecture.md): job → construction → checkpoints → zero, never back;
and the engine (`zero/`) knows nothing of the manifest: no spec types, no job-side module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
ORDER = ("job", "construction", "checkpoints", "zero")
ALLOWED: set[tuple[str, str]] = set()
"""Edges back, each named in docs/architecture.md's known debt (none now: the engine gives and takes its state and
knows nothing of files)."""


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("room", ORDER[1:])
def test_a_room_imports_no_room_above_it(room: str) -> None:
    above = ORDER[: ORDER.index(room)]
    bad = [
        f"{path.relative_to(RUNTIME)} imports {module}"
        for path in sorted((RUNTIME / room).glob("*.py"))
        for module in imported(path)
        if any(module.startswith(f"zerotrain.runtime.{r}") for r in above)
        and (path.relative_to(RUNTIME).as_posix(), module) not in ALLOWED
    ]
    assert not bad, bad


def test_the_engine_knows_no_manifest() -> None:
    bad = [
        f"{path.relative_to(RUNTIME)} imports {module}"
        for path in sorted((RUNTIME / "zero").glob("*.py"))
        for module in imported(path)
        if module in ("zerotrain.spec", "zerotrain.job_status", "zerotrain.manifest")
    ]
    assert not bad, bad
