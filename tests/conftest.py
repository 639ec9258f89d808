"""Project-wide test setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from budget import budget
from long_tier import LONG

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


# Files whose tests each run whole jobs for minutes: handed to workers first, so no worker starts one near the end
# while the others have run dry (`make test` hands out whole files in this order: `--dist loadfile
# --no-loadscope-reorder`).
LONGEST_FIRST = ("integration", "e2e", "bench", "docs")


def _file_order(item: pytest.Item) -> int:
    parts = item.path.relative_to(Path(__file__).parent).parts
    return LONGEST_FIRST.index(parts[0]) if parts[0] in LONGEST_FIRST else len(LONGEST_FIRST)


# First: `-m "not long"` deselects by the marks this adds (pytest's own hook runs after a conftest's tryfirst one).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (a stable sort, so each file's tests stay together and in order); pytest-timeout's
    limit per test, scaled by the suite's budget (tests/budget.py) like every wait inside it."""
    items.sort(key=_file_order)
    _mark_long(items, whole=not any("::" in str(a) for a in config.args))
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker is not None and marker.args else default
        if limit > 0:
            item.add_marker(pytest.mark.timeout(budget(limit)), append=False)


def _mark_long(items: list[pytest.Item], whole: bool = True) -> None:
    """Marks the long tier's tests `long` (tests/long_tier.py); an entry whose file was collected but which names
    none of its tests fails the run, so a renamed test cannot leave both tiers unseen (`whole`: the files were
    collected whole, not one test of them picked by its node id)."""
    files = {item.nodeid.split("::", 1)[0] for item in items}
    long = frozenset(LONG)
    found: set[str] = set()
    for item in items:
        if item.nodeid in long:
            item.add_marker(pytest.mark.long)
            found.add(item.nodeid)
    stale = [entry for entry in LONG if entry.split("::", 1)[0] in files and entry not in found]
    if stale and whole:
        raise pytest.UsageError(f"tests/long_tier.py names tests that do not exist: {stale}; fix or remove them")
