"""Project-wide test setup."""

from __future__ import annotations

import os

# The repository root holds a folder named `operator` (installed as zerotrain.operator). `python -m ...` started
# from the root would put it on sys.path ahead of the standard library's `operator` and break start-up;
# safe-path mode (Python >= 3.11) keeps the working directory off sys.path for every child process.
os.environ["PYTHONSAFEPATH"] = "1"


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    """Files with slow (multi-process, end-to-end) tests first, the quick ones after: `make test` hands whole files
    to two workers in this order, and a long file handed out last leaves the other worker idle until it ends."""

    def weight(item) -> int:  # type: ignore[no-untyped-def]
        return 0 if item.get_closest_marker("slow") else 1

    by_file: dict[str, int] = {}
    for item in items:
        by_file[item.nodeid.split("::")[0]] = min(by_file.get(item.nodeid.split("::")[0], 1), weight(item))
    e2e_first = {f: (0 if "/e2e/" in f else 1) for f in by_file}
    items.sort(key=lambda it: (by_file[f := it.nodeid.split("::")[0]], e2e_first[f]))
