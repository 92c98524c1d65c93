"""Reading a published table (CSV) for an analysis: the one reader, with the row checks
every table gets. Each problem is a UsageError naming the file, the row and the column."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from holedger.errors import UsageError


def read_table(
    path: str, required: Sequence[str], hint: str
) -> tuple[str, list[str], list[tuple[int, dict[str, str]]]]:
    """(file name, header, rows): each row numbered as in the file (the header is row 1)
    and mapped by column, cells stripped; blank rows skipped. Refused: a file that is not
    UTF-8 CSV, an empty one, a missing ``required`` column (``hint`` names the columns), a
    column named twice, a row with another number of fields than the header."""
    name = Path(path).name
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"table {name}: cannot be read as CSV ({exc})") from None
    if not rows:
        raise UsageError(f"table {name}: empty", hint="the first row names the columns")
    header = [h.strip() for h in rows[0]]
    for column in required:
        if column not in header:
            raise UsageError(f"table {name}: missing column {column!r}", hint=hint)
    if len(set(header)) != len(header):
        raise UsageError(f"table {name}: a column name appears twice")
    out: list[tuple[int, dict[str, str]]] = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UsageError(
                f"table {name} row {line}: {len(row)} fields, the header has {len(header)}"
            )
        out.append((line, dict(zip(header, (c.strip() for c in row), strict=True))))
    return name, header, out


def table_number(name: str, line: int, column: str, text: str) -> Fraction:
    """A cell's number (a decimal or p/q), else a UsageError naming its row and column."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise UsageError(
            f"table {name} row {line}, column {column!r}: {text!r} is not a number"
        ) from None
