"""What the simulator reads in a request: the demo-task question, the report documents it
is shown (their quarterly tables), and a tokenizer stand-in for its usage counts.

The question language is the officeqa-lite generator's; a document is a ``# Company:
Annual Report YYYY`` heading followed by a ``| Quarter | ... |`` table (docs/SIMULATOR.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

_COMPANY = r"(?P<{}>[A-Z][A-Za-z&.' -]*?)"
_PERIOD = r"(?P<{}>Q[1-4] \d{{4}})"
_METRIC = r"(?P<metric>revenue|operating costs|marketing spend)"
_QUESTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        (
            "lookup",
            rf"What was the {_METRIC} of {_COMPANY.format('c1')} in {_PERIOD.format('p1')}\?",
        ),
        (
            "sum",
            rf"What was the total {_METRIC} of {_COMPANY.format('c1')} over the four quarters"
            r" of (?P<year>\d{4})",
        ),
        (
            "difference",
            rf"By how much did the {_METRIC} of {_COMPANY.format('c1')} change from "
            rf"{_PERIOD.format('p1')} to {_PERIOD.format('p2')}",
        ),
        (
            "pct_change",
            rf"What was the percentage change in the {_METRIC} of {_COMPANY.format('c1')} "
            rf"from {_PERIOD.format('p1')} to {_PERIOD.format('p2')}\?",
        ),
        (
            "cross_difference",
            rf"How much higher was the {_METRIC} of {_COMPANY.format('c1')} than that of "
            rf"{_COMPANY.format('c2')} in {_PERIOD.format('p1')}",
        ),
        (
            "cross_sum",
            rf"What was the combined {_METRIC} of {_COMPANY.format('c1')} and "
            rf"{_COMPANY.format('c2')} in {_PERIOD.format('p1')}",
        ),
    )
)
_DOC_HEADING = re.compile(r"^# (?P<company>[^:\n]+): Annual Report \d{4}\s*$", re.M)
_TABLE_HEADER = re.compile(r"^\|\s*Quarter\s*\|(?P<cols>.*)\|\s*$")
_TABLE_ROW = re.compile(r"^\|\s*(?P<period>Q[1-4] \d{4})\s*\|(?P<cells>.*)\|\s*$")
_TOKEN = re.compile(r"\w+|[^\w\s]")


Fact = tuple[str, str, str]  # (company, metric, period)


@dataclass(frozen=True)
class Question:
    """A demo-task question as the simulator understands it."""

    kind: str
    metric: str
    companies: tuple[str, ...]
    periods: tuple[str, ...]
    text: str

    def facts(self) -> list[Fact]:
        if self.kind.startswith("cross"):
            return [(c, self.metric, self.periods[0]) for c in self.companies]
        return [(self.companies[0], self.metric, p) for p in self.periods]


@dataclass
class Context:
    """What the simulator has read in its messages."""

    facts: dict[Fact, Decimal] = field(default_factory=dict)
    documents: set[str] = field(default_factory=set)
    searched: set[str] = field(default_factory=set)
    tool_turns: int = 0


def parse_question(text: str) -> Question | None:
    """The demo-task question in ``text``, or None when there is none."""
    for kind, pattern in _QUESTION_PATTERNS:
        match = pattern.search(text)
        if match is None:
            continue
        groups = match.groupdict()
        companies = tuple(groups[k].strip() for k in ("c1", "c2") if groups.get(k))
        if kind == "sum":
            periods: tuple[str, ...] = tuple(f"Q{q} {groups['year']}" for q in range(1, 5))
        else:
            periods = tuple(groups[k] for k in ("p1", "p2") if groups.get(k))
        return Question(kind, groups["metric"], companies, periods, match.group(0))
    return None


def read_documents(text: str, context: Context) -> None:
    """Add every table row of every report document in ``text`` to ``context``."""
    headings = list(_DOC_HEADING.finditer(text))
    for index, heading in enumerate(headings):
        end = headings[index + 1].start() if index + 1 < len(headings) else len(text)
        company = heading.group("company").strip()
        context.documents.add(company.lower())
        columns: list[str] = []
        for line in text[heading.end() : end].splitlines():
            line = line.strip()
            header = _TABLE_HEADER.match(line)
            if header:
                columns = [c.strip().lower() for c in header.group("cols").split("|")]
                continue
            row = _TABLE_ROW.match(line)
            if not row or not columns:
                continue
            cells = [c.strip() for c in row.group("cells").split("|")]
            if len(cells) != len(columns):
                continue
            for column, cell in zip(columns, cells, strict=True):
                try:
                    value = Decimal(cell.replace(",", ""))
                except ArithmeticError:
                    continue
                context.facts[(company.lower(), column, row.group("period"))] = value


def count_tokens(text: str) -> int:
    """A tokenizer stand-in: words (long ones split every 6 characters) and punctuation."""
    return sum(1 + (len(t) - 1) // 6 if t[0].isalnum() else 1 for t in _TOKEN.findall(text))


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)
