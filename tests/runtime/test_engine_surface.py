"""The engine's public surface is the short list docs/architecture.md names, and no room outside the engine
(job, construction, checkpoints, models) reads one of its private names."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
PUBLIC = {
    # training
    "forward",
    "backward",
    "step",
    "train",
    "eval",
    "synchronize",
    # state
    "state_dict",
    "load_state_dict",
    "full_state_dict",
    "layout",
    "refresh_parameters",
    # reports
    "accounting",
    # what it was built with and holds
    "module",
    "optimizer",
    "config",
    "device",
    "comm",
    "units",
    "steps",
    "micro_steps",
}


def engine_names() -> tuple[set[str], set[str]]:
    """ZeroEngine's public and private names: its methods and the attributes `__init__` and the methods set."""
    tree = ast.parse((RUNTIME / "zero" / "engine.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ZeroEngine"]
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    names = {n for n in names if not (n.startswith("__") and n.endswith("__"))}
    return {n for n in names if not n.startswith("_")}, {n for n in names if n.startswith("_")}


def test_the_engines_public_names_are_the_documented_few() -> None:
    public, _ = engine_names()
    assert public == PUBLIC, f"new: {sorted(public - PUBLIC)}, gone: {sorted(PUBLIC - public)}"
    documented = (RUNTIME.parent / "docs" / "architecture.md").read_text()
    assert all(f"`{n}" in documented for n in PUBLIC), [n for n in PUBLIC if f"`{n}" not in documented]


def test_no_room_outside_the_engine_reads_its_private_names() -> None:
    _, private = engine_names()
    bad = []
    for room in ("job", "construction", "checkpoints", "models"):
        for path in sorted((RUNTIME / room).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                if isinstance(node, ast.Attribute) and node.attr in private and not own:
                    bad.append(f"{path.relative_to(RUNTIME)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, bad
