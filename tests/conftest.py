"""Project-wide test setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from budget import budget

# The repository root holds a folder named `operator` (installed as zerotrain.operator). `python -m ...` started
# from the root would put it on sys.path ahead of the standard library's `operator` and break start-up;
# safe-path mode (Python >= 3.11) keeps the working directory off sys.path for every child process.
os.environ["PYTHONSAFEPATH"] = "1"

# Inductor's kernels compile against the headers of the torch that wrote its cache; the default cache
# (/tmp/torchinductor_<user>) is shared by every checkout on the machine, and one written by a venv since deleted
# fails to compile ("'at::vec' has not been declared"). Each checkout keeps its own.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "torchinductor"))
# Its precompiled headers stay under /tmp/torchinductor_<user> whatever the cache directory (torch 2.13), with the
# same failure after the venv is rebuilt; they only shorten compiles.
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's limit per test, scaled by the suite's budget (tests/budget.py) like every wait inside it."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker is not None and marker.args else default
        if limit > 0:
            item.add_marker(pytest.mark.timeout(budget(limit)), append=False)
