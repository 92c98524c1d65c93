"""Lever taxonomy and breadth (A12): every candidate diff classified into the eight
harness levers by rules, per run the levers modified during search, the total number of
edits beside it, and per task Spearman's rho(breadth, g).

Classification (reading, not stated): each diff hunk (``difflib`` over lines, the
candidate against its parent) is placed in the top-level symbol of the parent file it
touches (a constant, function or class of a Python file; an insertion belongs to the
symbol of the line before it, or, between two symbols, the one after it). A task may
declare rules in ``levers.toml`` beside its ``task.toml``::

    [[rule]]
    lever = "retrieval"             # one of the eight
    path = "harness/*.py"           # a glob over the candidate's paths
    symbols = ["search"]            # the hunk's symbol is one of these (optional)
    text = "corpus"                 # a changed line matches this regex (optional)

A hunk takes the levers of every task rule it matches; a hunk no task rule matches is
classified by the generic rules below (symbol names such as ``*PROMPT*``, ``MAX_STEPS``,
``*RETR*``); a hunk matching neither is counted as unclassified. Breadth = the levers
modified at least once / 8.

Examined (reading, not stated): the optimizer's recorded reads (OptimizerRead) name the
files it read, one by one or as a whole tree with its contents. A file read examines the
levers of every top-level symbol in it, by the same rules (a symbol's lines stand for a
hunk's changed lines; a file without symbols is one unnamed region); a tree read with
contents examines every file of that candidate. A run whose log records no read has no
examined half: breadth is then the levers modified alone, and the output says so.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from holedger.analysis.trees import Reader
from holedger.errors import UsageError
from holedger.tasks.edits import LEVERS

READING = (
    "A12: a hunk is classified by the top-level symbol it touches and the task's lever "
    "rules, else by generic symbol-name rules (reading, not stated); breadth counts "
    "levers examined or modified"
)
READING_EXAMINED = (
    "A12: a file the optimizer read examines the levers of every top-level symbol in it, "
    "a tree read with contents every file of that candidate (reading, not stated)"
)


@dataclass(frozen=True)
class LeverRule:
    lever: str
    path: str = "*"
    symbols: tuple[str, ...] = ()  # exact names (task rules)
    pattern: str | None = None  # a regex over the symbol name (generic rules)
    text: str | None = None  # a regex over the changed lines

    def matches(self, path: str, symbol: str | None, changed: Sequence[str]) -> bool:
        if not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.symbols and symbol not in self.symbols:
            return False
        if self.pattern is not None and (
            symbol is None or not re.search(self.pattern, symbol, re.IGNORECASE)
        ):
            return False
        if self.text is not None and not any(re.search(self.text, line) for line in changed):
            return False
        return True


GENERIC_RULES = (
    LeverRule("prompt", pattern=r"prompt|system|instruction(?!.*answer)"),
    LeverRule("answer_extraction", pattern=r"answer|extract|parse|final"),
    LeverRule("step_cap", pattern=r"max_(steps|turns|iter)|step_cap|turn_limit"),
    LeverRule("retry_timeout", pattern=r"retr|timeout|backoff"),
    LeverRule("tool_schema", pattern=r"^tools?$|tool_schema|functions"),
    LeverRule("retrieval", pattern=r"search|retriev|fetch|lookup|top_k"),
    LeverRule("reasoning_effort", pattern=r"reason|effort|think"),
    LeverRule("context_management", pattern=r"context|history|truncat|tool_result|memory"),
)


def load_rules(task_root: Path | None) -> list[LeverRule]:
    """The task's rules from ``levers.toml`` (none when it has no such file)."""
    if task_root is None or not (task_root / "levers.toml").is_file():
        return []
    name = f"{task_root.name}/levers.toml"
    try:
        spec = tomllib.loads((task_root / "levers.toml").read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{name}: not valid TOML ({exc})") from None
    rules = []
    for i, raw in enumerate(spec.get("rule", []), start=1):
        lever = raw.get("lever")
        if lever not in LEVERS:
            raise UsageError(f"{name} rule {i}: unknown lever {lever!r}", hint=", ".join(LEVERS))
        rules.append(
            LeverRule(
                lever,
                path=str(raw.get("path", "*")),
                symbols=tuple(str(s) for s in raw.get("symbols", [])),
                text=raw.get("text"),
            )
        )
    return rules


def _symbols(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each top-level definition, 1-based; [] when the
    text is not Python."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        for name in names:
            out.append((node.lineno, node.end_lineno or node.lineno, name))
    return out


@dataclass
class Classified:
    levers: set[str] = field(default_factory=set)
    hunks: int = 0
    unclassified: int = 0


def classify_change(
    path: str, old: str, new: str, rules: Sequence[LeverRule], into: Classified | None = None
) -> Classified:
    """Classify the hunks turning ``old`` into ``new`` (one file)."""
    out = into or Classified()
    old_lines, new_lines = old.splitlines(), new.splitlines()
    symbols = _symbols(old) if old else _symbols(new)
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        out.hunks += 1
        changed = old_lines[i1:i2] + new_lines[j1:j2]
        if not old:
            lines = range(j1 + 1, j2 + 1)
        elif i1 == i2:
            lines = range(max(i1, 1), max(i1, 1) + 1)  # an insertion: the line before it
        else:
            lines = range(i1 + 1, i2 + 1)
        touched: list[str | None] = [
            name for first, last, name in symbols if first <= max(lines) and last >= min(lines)
        ]
        if not touched and old and i1 == i2:  # inserted between symbols: the one after it
            touched = [name for first, last, name in symbols if first <= i1 + 1 <= last]
        if not touched:
            touched = [None]
        found: set[str] = set()
        for symbol in touched:
            found |= _levers_of(path, symbol, changed, rules)
        if found:
            out.levers |= found
        else:
            out.unclassified += 1
    return out


def _levers_of(
    path: str, symbol: str | None, lines: Sequence[str], rules: Sequence[LeverRule]
) -> set[str]:
    """The levers of one region: the task's rules that match it, else the generic ones."""
    task = {r.lever for r in rules if r.matches(path, symbol, lines)}
    return task or {r.lever for r in GENERIC_RULES if r.matches(path, symbol, lines)}


def levers_in_file(path: str, text: str, rules: Sequence[LeverRule]) -> set[str]:
    """The levers a read of the whole file examines: those of each top-level symbol (its
    lines as the changed lines), or of the file as one region when it has none."""
    lines = text.splitlines()
    symbols = _symbols(text)
    if not symbols:
        return _levers_of(path, None, lines, rules)
    found: set[str] = set()
    for first, last, name in symbols:
        found |= _levers_of(path, name, lines[first - 1 : last], rules)
    return found


def classify_candidate(
    commit: str,
    parent: str,
    paths: Sequence[str],
    read: Reader,
    rules: Sequence[LeverRule],
) -> Classified:
    """The levers one candidate's diff against its parent modifies."""
    out = Classified()
    for path in paths:
        before, after = read(parent, path), read(commit, path)
        if before == after:
            continue
        classify_change(path, before or "", after or "", rules, out)
    return out
