"""Reading a published table (CSV) for an analysis: the one reader, with the row checks
every table gets. Each problem is a UsageError naming the file, the row and the column."""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from holedger.errors import UsageError


def read_table(
    path: str, required: Sequence[str], hint: str
) -> tuple[str, list[str], list[tuple[int, dict[str, str]]]]:
    """(file name, header, rows): each row numbered as in the file (the first row that
    is not blank is the header) and mapped by column, cells stripped; blank rows skipped.
    A UTF-8 byte-order mark and CRLF line ends are read as a spreadsheet writes them.
    Refused: a file that is not UTF-8 CSV (an unclosed quote too), an empty one, a missing
    ``required`` column (``hint`` names the columns), a column with no name or named twice,
    a row with another number of fields than the header, no row below the header."""
    name = Path(path).name
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle, strict=True))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(
            f"table {name}: cannot be read as CSV ({exc})", hint="save it as UTF-8 CSV"
        ) from None
    first = next((i for i, row in enumerate(rows) if any(c.strip() for c in row)), None)
    if first is None:
        raise UsageError(f"table {name}: empty", hint="the first row names the columns")
    header = [h.strip() for h in rows[first]]
    for column in required:
        if column not in header:
            raise UsageError(f"table {name}: missing column {column!r}", hint=hint)
    if "" in header:
        raise UsageError(
            f"table {name}: column {header.index('') + 1} has no name",
            hint="name every column in the first row (a trailing comma makes an empty one)",
        )
    twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
    if twice is not None:
        raise UsageError(
            f"table {name}: column {twice!r} appears twice", hint="keep one column per name"
        )
    out: list[tuple[int, dict[str, str]]] = []
    for line, row in enumerate(rows[first + 1 :], start=first + 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UsageError(
                f"table {name} row {line}: {len(row)} fields, the header has {len(header)}",
                hint="quote a cell that holds a comma; give every row every column",
            )
        out.append((line, dict(zip(header, (c.strip() for c in row), strict=True))))
    if not out:
        raise UsageError(f"table {name}: no row below the header", hint=hint)
    return name, header, out


# A decimal (ASCII digits, an optional exponent) or p/q: what a published table writes.
# Fraction() alone would also take "1_000", other scripts' digits, nan and inf.
_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?|[+-]?[0-9]+/[0-9]+"
)


def plain_number(text: str) -> Fraction | None:
    """``text`` as a decimal or p/q, else None."""
    if _NUMBER.fullmatch(text) is None:
        return None
    try:
        return Fraction(text)
    except ZeroDivisionError:
        return None


def table_number(name: str, line: int, column: str, text: str) -> Fraction:
    """A cell's number (a decimal or p/q), else a UsageError naming its row and column."""
    number = plain_number(text)
    if number is None:
        raise UsageError(
            f"table {name} row {line}, column {column!r}: {text!r} is not a number",
            hint="a decimal such as 0.125 or a fraction p/q",
        )
    return number
