"""Tables fit the terminal: at 80 columns (a pipe's default) no header or cell is cut to "…"; a table too wide
prints a `column: value` block per row instead."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from zerotrain.cli import main
from zerotrain.commands.tables import Rows, print_rows

ROOT = Path(__file__).resolve().parents[2]


def _printed(rows: Rows, width: int) -> str:
    out = io.StringIO()
    print_rows(rows, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def _rows() -> Rows:
    rows = Rows("checkpoints", ("checkpoint", "step", "complete"), left=frozenset({"checkpoint", "complete"}))
    rows.add("step-00000004-0badcafe", "4", "no: no COMMITTED marker (a save cut short or still running)")
    rows.add("step-00000008-feedf00d", "8", "yes (verified)")
    return rows


def test_a_table_that_fits_prints_as_a_table() -> None:
    text = _printed(_rows(), 160)
    assert "┃ checkpoint" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 160


def test_a_table_too_wide_prints_each_row_as_lines_with_nothing_cut() -> None:
    text = _printed(_rows(), 60)
    assert "…" not in text and "┃" not in text
    assert "  checkpoint  step-00000004-0badcafe" in text
    assert "  complete    no: no COMMITTED marker (a save cut short or still running)" in text
    assert "  step        8" in text


@pytest.mark.parametrize("manifest", ["gpu-70b.yaml", "gpu-7b.yaml", "quickstart.yaml"])
def test_plan_fits_80_columns(
    manifest: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "-f", str(ROOT / "examples" / manifest)]) == 0
    text = capsys.readouterr().out
    tables = [line for line in text.splitlines() if line[:1] in "┏┃┡│├└"]
    assert tables and all(len(line) <= 80 for line in tables), text
    assert "…" not in text
    assert "whole peak per rank" in text and "┃ term" in text
    # Each term names its stage's figure in its own unit: a small term is not "0.0" of a TB column.
    assert not any(" 0.0 " in line for line in tables), text


def test_plan_json_is_unchanged_by_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = []
    for columns in ("40", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["plan", "-f", str(ROOT / "examples" / "gpu-7b.yaml"), "--output", "json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
