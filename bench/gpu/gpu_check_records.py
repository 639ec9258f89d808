"""bench/gpu/gpu_check.py's check records: one printed line per check, appended to a JSON-lines file as it happens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OK, FAILED, NOT_POSSIBLE, SKIPPED = "ok", "FAILED", "not possible", "skipped"


def line(rec: dict[str, Any]) -> str:
    """One check as one printed line."""
    return f"{rec['status']:>12}  {rec['phase']}: {rec['name']}: {rec['detail']}"


class Checks:
    """A phase's check records: printed, and appended to a JSON-lines file as they happen (a crash keeps them)."""

    def __init__(self, phase: str, path: Path | None) -> None:
        self.phase, self.path = phase, path
        self.records: list[dict[str, Any]] = []
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def add(self, name: str, ok: bool | str, detail: str, **figures: Any) -> bool:
        status = ok if isinstance(ok, str) else (OK if ok else FAILED)
        rec = {"phase": self.phase, "name": name, "status": status, "detail": detail, "figures": figures}
        self.records.append(rec)
        print(line(rec), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
        return status != FAILED

    def extend(self, records: list[dict[str, Any]], prefix: str = "") -> None:
        for r in records:
            self.add(prefix + r["name"], r["status"], r["detail"], **r.get("figures", {}))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file written by `Checks`."""
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(ln) for ln in text[: text.rfind("\n") + 1].splitlines() if ln.strip()]
