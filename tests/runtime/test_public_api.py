"""The runtime's public API: what entry points and engine users import, from `zerotrain.runtime` alone; the first
homes of the entry-point contract still import (with a DeprecationWarning); examples and docs use the public path."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zerotrain.runtime as runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", runtime.__all__)
def test_every_public_name_resolves(name: str) -> None:
    value = getattr(runtime, name)
    assert getattr(value, "__name__", name) == name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'TrainingTasks'"):
        _ = runtime.TrainingTasks  # type: ignore[attr-defined]


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, zerotrain.runtime; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(("old", "names"), [("task", ["TrainingTask", "ConfigError"]), ("data", ["rank_rows"])])
def test_the_first_homes_still_import_and_say_where_to(old: str, names: list[str]) -> None:
    sys.modules.pop(f"zerotrain.runtime.{old}", None)
    with pytest.warns(DeprecationWarning, match="import .* from zerotrain.runtime"):
        module = importlib.import_module(f"zerotrain.runtime.{old}")
    for name in names:
        assert getattr(module, name) is getattr(runtime, name)


def test_examples_and_docs_import_only_the_public_api() -> None:
    internal = re.compile(r"zerotrain\.runtime\.(job|zero|checkpoints|construction)\b")
    texts = [*ROOT.glob("examples/**/*.py"), ROOT / "README.md", *ROOT.glob("docs/*.md")]
    found = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in texts
        if p.name != "architecture.md"  # the map of the internals
        for line in p.read_text().splitlines()
        if internal.search(line) and ("import" in line or "TrainingTask" in line)
    ]
    assert not found, found
