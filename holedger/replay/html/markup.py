"""HTML building blocks of the report: escaping, number forms, tables."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

from holedger.replay.html.data import as_fraction
from holedger.schemas.untrusted import escape_text


def esc(value: Any) -> str:
    """``value`` as HTML text: markup escaped, and no control character, escape sequence
    or bidi override of it left raw (``holedger.schemas.untrusted``)."""
    return html.escape(escape_text(str(value)), quote=True)


def fmt_num(value: Any, digits: int = 3) -> str:
    """A rational or number as a short decimal; anything else as text."""
    frac = value if isinstance(value, Fraction) else as_fraction(value)
    if frac is None:
        return "-" if value is None else str(value)
    if frac.denominator == 1:
        return str(frac.numerator)
    return f"{float(frac):.{digits}f}"


def fmt_score(value: Any) -> str:
    """A score, mean, gain or band, always to three decimals (``0.000`` beside ``0.333``,
    never ``0``); ``-`` when there is none."""
    frac = value if isinstance(value, Fraction) else as_fraction(value)
    if frac is None:
        return "-" if value is None else str(value)
    return f"{float(frac):.3f}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        text = json.dumps(value, sort_keys=True, default=str)
        return esc(text if len(text) <= 200 else text[:197] + "...")
    return esc(value)


def html_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    klass = f' class="{esc(cls)}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def records_table(items: Sequence[dict[str, Any]], limit: int = 200) -> str:
    if not items:
        return "<p class='muted'>none</p>"
    columns: list[str] = []
    for item in items[:limit]:
        for key in item:
            if key not in columns:
                columns.append(key)
    rows = [[item.get(c, "") for c in columns] for item in items[:limit]]
    more = f"<p class='muted'>... {len(items) - limit} more</p>" if len(items) > limit else ""
    return html_table(columns, rows) + more


def generic(value: Any) -> str:
    """Any JSON-shaped section as nested definition lists and tables."""
    if isinstance(value, dict):
        if not value:
            return "<p class='muted'>empty</p>"
        parts = []
        for key, item in value.items():
            parts.append(f"<dt>{esc(key)}</dt><dd>{generic(item)}</dd>")
        return "<dl>" + "".join(parts) + "</dl>"
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return records_table(value)
        if not value:
            return "<span class='muted'>none</span>"
        return esc(", ".join(str(v) for v in value))
    return _cell(value)
