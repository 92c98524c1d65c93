"""HTML building blocks of the report: escaping, number forms, tables.

Every text that comes from a run (ids, paths, reasons, details a harness chose, diff
lines) is untrusted: :func:`esc` escapes the HTML specials and writes every control
character, escape sequence and bidi override as its backslash escape, so no byte of it
is markup, and no escape sequence reaches a terminal that prints the page's source.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from holedger.numbers import amount, decimal
from holedger.untrusted import escape_text


def esc(value: Any) -> str:
    """``value`` as HTML text: markup escaped, and no control character, escape sequence
    or bidi override of it left raw (``holedger.untrusted``)."""
    return html.escape(escape_text(str(value)), quote=True)


def fmt_num(value: Any) -> str:
    """A total for people (case-passes used, a limit): the shortest decimal."""
    return amount(value)


def fmt_score(value: Any) -> str:
    """A score, mean, gain or band, always to three decimals (``0.000`` beside ``0.333``,
    never ``0``); ``-`` when there is none (the one rule of ``holedger.numbers``)."""
    return decimal(value)


def cell(value: Any) -> str:
    """One table cell's HTML: text escaped; a value that is already markup is a
    :class:`Markup`."""
    if isinstance(value, Markup):
        return value.html
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return esc(value)


class Markup:
    """HTML built by this package (never from untrusted text without :func:`esc`)."""

    def __init__(self, html_text: str) -> None:
        self.html = html_text


def html_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    cls: str = "",
    row_classes: Sequence[str] | None = None,
) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        klass = row_classes[i] if row_classes and i < len(row_classes) else ""
        attr = f' class="{esc(klass)}"' if klass else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>")
    klass = f' class="{esc(cls)}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'
