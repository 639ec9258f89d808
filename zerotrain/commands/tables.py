"""Tables that fit the terminal. A table whose natural width is wider than the console prints as one block of
`column: value` lines per row instead: rich would otherwise shrink its columns until headers and cells read "s…",
and a cut figure is worse than a longer listing. Output that is not a terminal is 80 columns wide unless COLUMNS
says otherwise, so a pipe gets the same choice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Cell = str | Text


@dataclass
class Rows:
    """A table's content, before it is decided how it prints."""

    title: str
    """Printed above the table, or above the listing."""
    columns: Sequence[str]
    """Column headers, left to right."""
    left: frozenset[str] = frozenset()
    """Columns aligned left (names, verdicts); the rest are figures, aligned right."""
    rows: list[list[Cell]] = field(default_factory=list)
    """The cells, one list per row, in the columns' order."""
    sections: set[int] = field(default_factory=set)
    """Row indices after which a rule separates groups (a rank's rows, say)."""

    def add(self, *cells: Cell) -> None:
        self.rows.append(list(cells))

    def end_section(self) -> None:
        if self.rows:
            self.sections.add(len(self.rows) - 1)


def as_table(rows: Rows) -> Table:
    """The rows as a rich table whose cells never wrap or shrink."""
    table = Table(title=rows.title, title_justify="left")
    for name in rows.columns:
        table.add_column(name, justify="left" if name in rows.left else "right", no_wrap=True)
    for i, cells in enumerate(rows.rows):
        table.add_row(*cells, end_section=i in rows.sections)
    return table


def fits(table: Table, console: Console) -> bool:
    """Whether the table prints whole within the console's width."""
    # Measured without the console's limit: rich clamps a measurement to the width it is given.
    unbounded = console.options.update(max_width=1 << 16)
    return Measurement.get(console, unbounded, table).maximum <= console.width


def print_rows(rows: Rows, console: Console) -> None:
    """A table when it fits the console, else one `column: value` block per row."""
    table = as_table(rows)
    if fits(table, console):
        console.print(table)
        return
    console.print(Text(rows.title, style="italic"), soft_wrap=True)
    width = max(len(c) for c in rows.columns)
    for i, cells in enumerate(rows.rows):
        for name, cell in zip(rows.columns, cells, strict=True):
            value = cell if isinstance(cell, Text) else Text(cell)
            console.print(Text.assemble(f"  {name:<{width}}  ", value), soft_wrap=True)
        if i != len(rows.rows) - 1:
            console.print()
