"""The runtime's rooms import one way (docs/architecture.md): job → construction → checkpoints → zero, never back;
and the engine (`zero/`) knows nothing of the manifest: no spec types, no job-side module."""

from __future__ import annotations

from pathlib import Path

import pytest
from rooms import imported, imports_above

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
ORDER = ("job", "construction", "checkpoints", "zero")
ALLOWED: set[tuple[str, str]] = set()
"""Edges back, each named in docs/architecture.md's known debt (none now: the engine gives and takes its state and
knows nothing of files)."""


@pytest.mark.parametrize("room", ORDER[1:])
def test_a_room_imports_no_room_above_it(room: str) -> None:
    edges = imports_above(RUNTIME, "zerotrain.runtime", ORDER, room)
    bad = [f"{path} imports {module}" for path, module in edges if (path, module) not in ALLOWED]
    assert not bad, bad


def test_the_engine_knows_no_manifest() -> None:
    bad = [
        f"{path.relative_to(RUNTIME)} imports {module}"
        for path in sorted((RUNTIME / "zero").glob("*.py"))
        for module in imported(path)
        if module in ("zerotrain.spec", "zerotrain.job_status", "zerotrain.manifest")
    ]
    assert not bad, bad
