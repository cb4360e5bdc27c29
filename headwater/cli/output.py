"""What the command line prints: tables that read the same in a terminal, a pipe and a
script, lines, and one-line errors.

A table is printed as plain columns, as rpk and Kafka's own tools print theirs::

    PARTITION  LEADER  REPLICAS  ISR    HIGH-WATERMARK
    0          1       1,2,3     1,2,3  120

Headers are in capitals with ``-`` for spaces and an empty cell prints ``-``, so every
row has the same number of whitespace-separated fields (``awk '{print $5}'`` works);
columns are separated by two spaces and padded to their widest cell; nothing is cut,
wrapped or drawn, whatever the terminal's width (a long member id stays whole in
``| less -S`` and in ``grep``). The last column is not padded, so lines carry no
trailing blanks.

An error is one line on stderr, ``error: CODE: message`` (``fail``), and the command
exits with status 1 (2 for usage errors); never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import click

WAIT_NOTE_S = 1.0
"""A command that waits longer than this says on stderr what it waits for."""
COLUMN_GAP = "  "
EMPTY_CELL = "-"


class Table:
    """Rows of text cells under headers; ``lines()`` lays them out (module docstring)."""

    def __init__(self, *headers: str) -> None:
        self.headers = [header.upper().replace(" ", "-") for header in headers]
        self.rows: list[list[str]] = []

    def add_column(self, header: str) -> None:
        """Add a column at the right; rows already added get an empty cell in it."""
        self.headers.append(header.upper().replace(" ", "-"))
        for row in self.rows:
            row.append(EMPTY_CELL)

    def add_row(self, *cells: object) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.headers)}")
        self.rows.append([_cell(cell) for cell in cells])

    def lines(self) -> list[str]:
        every = [self.headers, *self.rows]
        widths = [max(len(row[i]) for row in every) for i in range(len(self.headers))]
        return [_line(row, widths) for row in every]


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    # One line a row: a newline or tab inside a cell (a client id is the client's choice)
    # would break the columns.
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text if text.strip() else EMPTY_CELL


def _line(row: Sequence[str], widths: Sequence[int]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths[:-1], strict=True)]
    return COLUMN_GAP.join([*padded, row[-1]])


def print_table(table: Table) -> None:
    click.echo("\n".join(table.lines()))


def echo(text: str) -> None:
    """One line of text on stdout, as given: never wrapped to the terminal's width."""
    click.echo(text)


def fail(message: str, status: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``status``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(status)
