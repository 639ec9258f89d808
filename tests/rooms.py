"""What a package's rooms import, read from their source: the layering tests of the runtime and the operator."""

from __future__ import annotations

import ast
from pathlib import Path


def imported(path: Path) -> set[str]:
    """The modules one source file imports (absolute names, as `import` and `from ... import` write them)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def imports_above(root: Path, package: str, order: tuple[str, ...], room: str) -> list[tuple[str, str]]:
    """(file, module) for each import in `root/room` of a room listed before it in `order` (`package.<room>`)."""
    above = order[: order.index(room)]
    return [
        (path.relative_to(root).as_posix(), module)
        for path in sorted((root / room).glob("*.py"))
        for module in imported(path)
        if any(module.startswith(f"{package}.{r}") for r in above)
    ]
