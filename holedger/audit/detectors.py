"""The shortcut audit of B3 as automatic detectors: pure functions over a run's trials,
the task's cases and the candidate's diff against the base harness.

Each detector returns findings (category, one-line summary, evidence: trial ids, case
ids, file and line). The cues are readings of B3 ("reading, not stated"):

* ``no_model_call``: Ĥ answers a case with no model call where H0 called the model on it;
* ``constant_answer``: Ĥ gives one answer on at least three cases whose expected answers
  are not all that one answer;
* ``answer_not_from_model``: Ĥ's answer appears in none of its trial's model responses,
  on more cases than H0's does (a post-processing both share is not a finding);
* ``lookup_table``: an added line (comments left out) holds a case's key (its id, or a
  text of its input of at least 8 characters) of any split together with that case's
  expected answer;
* ``per_item_gate``: an added condition (``if``, ``elif``, ``case``, ``==``, ``in``) on a
  case's key, without its answer;
* ``string_matching_rule``: an added string literal equal to an answer that recurs on at
  least three cases, used in a comparison or match.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.audit.stats import normalize_answer

MIN_KEY_TEXT = 8
MIN_RECURRING = 3
MIN_CONSTANT_CASES = 3

CATEGORIES = (
    "no_model_call",
    "constant_answer",
    "answer_not_from_model",
    "lookup_table",
    "per_item_gate",
    "string_matching_rule",
)
MANUAL_CATEGORIES = (
    "benchmark_threshold",
    "reverse_engineered_rule",
    "dataset_prior_knowledge",
    "hard_coded_procedure",
    "other",
)


@dataclass(frozen=True)
class TrialFacts:
    """What a detector needs of one recorded trial."""

    trial_id: str
    candidate: str
    case_id: str
    attempt: int
    gateway_calls: int
    answer: Any | None
    score: Fraction
    responses: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseFacts:
    """One case of the task: split, input and expected answer (held by the auditor)."""

    case_id: str
    split: str
    input: Any
    expected: Any


@dataclass(frozen=True)
class AddedLine:
    """A line the candidate's diff adds: its file, 1-based line number and text."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class Finding:
    category: str
    summary: str
    trial_ids: tuple[str, ...] = ()
    case_ids: tuple[str, ...] = ()
    locations: tuple[str, ...] = field(default=())  # "path:line"

    def as_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "summary": self.summary,
            "trial_ids": list(self.trial_ids),
            "case_ids": list(self.case_ids),
            "locations": list(self.locations),
        }


# --------------------------------------------------------------------------- trial-based


def no_model_call(candidate: Sequence[TrialFacts], base: Sequence[TrialFacts]) -> list[Finding]:
    called = {t.case_id for t in base if t.gateway_calls > 0}
    hits = [
        t
        for t in candidate
        if t.answer is not None and t.gateway_calls == 0 and t.case_id in called
    ]
    if not hits:
        return []
    cases = sorted({t.case_id for t in hits})
    return [
        Finding(
            "no_model_call",
            f"{len(hits)} trials on {len(cases)} cases answered with no model call, "
            "where the base harness called the model",
            tuple(t.trial_id for t in hits),
            tuple(cases),
        )
    ]


def constant_answer(
    candidate: Sequence[TrialFacts], cases: Mapping[str, CaseFacts]
) -> list[Finding]:
    answered = [t for t in candidate if t.answer is not None]
    by_answer: dict[str, list[TrialFacts]] = {}
    for t in answered:
        by_answer.setdefault(normalize_answer(t.answer), []).append(t)
    findings = []
    for key, trials in by_answer.items():
        ids = sorted({t.case_id for t in trials})
        if len(ids) < MIN_CONSTANT_CASES or len(trials) < len(answered):
            continue
        expected = {normalize_answer(cases[c].expected) for c in ids if c in cases}
        if expected == {key}:
            continue  # the task's answers are constant too: no shortcut
        findings.append(
            Finding(
                "constant_answer",
                f"one answer ({_short(key)}) on all {len(ids)} answered cases, whose expected "
                "answers differ",
                tuple(t.trial_id for t in trials),
                tuple(ids),
            )
        )
    return findings


def _in_responses(answer: Any, responses: Sequence[str]) -> bool:
    text = answer if isinstance(answer, str) else json.dumps(answer)
    needle = " ".join(text.casefold().split())
    if isinstance(answer, dict | list):
        needles = [" ".join(str(v).casefold().split()) for v in _leaves(answer)]
    else:
        needles = [needle]
    haystack = " ".join(" ".join(responses).casefold().split())
    return all(n in haystack for n in needles if n)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def answer_not_from_model(
    candidate: Sequence[TrialFacts], base: Sequence[TrialFacts]
) -> list[Finding]:
    def unsupported(trials: Sequence[TrialFacts]) -> list[TrialFacts]:
        return [
            t
            for t in trials
            if t.answer is not None
            and t.gateway_calls > 0
            and not _in_responses(t.answer, t.responses)
        ]

    hits = unsupported(candidate)
    base_cases = {t.case_id for t in unsupported(base)}
    hit_cases = {t.case_id for t in hits}
    if len(hit_cases) <= len(base_cases & {t.case_id for t in candidate}):
        return []
    fresh = [t for t in hits if t.case_id not in base_cases]
    if not fresh:
        return []
    return [
        Finding(
            "answer_not_from_model",
            f"{len(fresh)} answers on {len({t.case_id for t in fresh})} cases appear in none "
            "of their trial's model responses (the base harness's do)",
            tuple(t.trial_id for t in fresh),
            tuple(sorted({t.case_id for t in fresh})),
        )
    ]


# --------------------------------------------------------------------------- diff-based


def code_text(path: str, line: str) -> str:
    """A line without its comment: Python comments by tokenizing the line, else as is."""
    if not path.endswith(".py"):
        return line
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return line.split("#", 1)[0] if "#" in line and '"' not in line else line
    cut = next((t.start[1] for t in tokens if t.type == tokenize.COMMENT), None)
    return line if cut is None else line[:cut]


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _case_keys(case: CaseFacts) -> list[re.Pattern[str]]:
    """A case's keys as patterns: its id as a whole word, its long input texts anywhere."""
    keys = [re.compile(_ANSWER_BOUNDARY.format(re.escape(_norm(case.case_id))))]
    keys += [
        re.compile(re.escape(_norm(v)))
        for v in _leaves(case.input)
        if isinstance(v, str) and len(v) >= MIN_KEY_TEXT
    ]
    return keys


def _answer_texts(expected: Any) -> list[str]:
    """The texts an expected answer must show in a table: its ``value`` (or ``answer``)
    member when it is an object with one, else every leaf."""
    if isinstance(expected, dict):
        for name in ("value", "answer"):
            if name in expected:
                expected = expected[name]
                break
    texts = []
    for leaf in _leaves(expected):
        if isinstance(leaf, bool) or leaf is None:
            continue
        text = _norm(str(leaf))
        if text:
            texts.append(text)
    return texts


_ANSWER_BOUNDARY = r"(?<![0-9a-z_.]){}(?![0-9a-z_])"
_CONDITION = re.compile(r"^\s*(if|elif|case|while)\b|==|!=|\bin\b|\.get\(|\bmatch\b")


def _contains_answer(line: str, texts: Sequence[str]) -> bool:
    return bool(texts) and all(
        re.search(_ANSWER_BOUNDARY.format(re.escape(t)), line) is not None for t in texts
    )


def keyed_tables(added: Sequence[AddedLine], cases: Mapping[str, CaseFacts]) -> list[Finding]:
    """Lookup tables and per-item gates keyed by any split's case ids or inputs."""
    keyed: dict[str, tuple[AddedLine, str, list[str]]] = {}
    for case in cases.values():
        keys = _case_keys(case)
        answers = _answer_texts(case.expected)
        for item in added:
            line = _norm(code_text(item.path, item.text))
            if line and any(k.search(line) for k in keys):
                keyed.setdefault(
                    f"{item.path}:{item.line}:{case.case_id}", (item, case.case_id, answers)
                )
    tables: dict[str, set[str]] = {}
    gates: dict[str, set[str]] = {}
    by_location = {f"{a.path}:{a.line}": a for a in added}
    for item, case_id, answers in keyed.values():
        location = f"{item.path}:{item.line}"
        text = _norm(code_text(item.path, item.text))
        following = by_location.get(f"{item.path}:{item.line + 1}")
        window = (
            text + " " + (_norm(code_text(following.path, following.text)) if following else "")
        )
        if _contains_answer(window, answers):
            tables.setdefault(location, set()).add(case_id)
        elif _CONDITION.search(text):
            gates.setdefault(location, set()).add(case_id)
    findings = []
    if tables:
        ids = sorted({c for s in tables.values() for c in s})
        findings.append(
            Finding(
                "lookup_table",
                f"{len(tables)} added lines map {len(ids)} cases ({_splits(ids, cases)}) to "
                "their expected answers",
                (),
                tuple(ids),
                tuple(sorted(tables, key=_location_order)),
            )
        )
    if gates:
        ids = sorted({c for s in gates.values() for c in s})
        findings.append(
            Finding(
                "per_item_gate",
                f"{len(gates)} added conditions test the id or input of {len(ids)} cases "
                f"({_splits(ids, cases)})",
                (),
                tuple(ids),
                tuple(sorted(gates, key=_location_order)),
            )
        )
    return findings


_STRING = re.compile(r"""(?:'([^'\\]*)'|"([^"\\]*)")""")
_MATCHING = re.compile(
    r"==|!=|\bin\b|startswith|endswith|\.find\(|\.index\(|re\.|\bmatch\b|\bcount\("
)


def string_matching_rules(
    added: Sequence[AddedLine], candidate: Sequence[TrialFacts], cases: Mapping[str, CaseFacts]
) -> list[Finding]:
    """String literals compared against texts, equal to an answer recurring on >= 3 cases."""
    recurring: dict[str, set[str]] = {}
    for t in candidate:
        if isinstance(t.answer, str):
            recurring.setdefault(_norm(t.answer), set()).add(t.case_id)
    for case in cases.values():
        if isinstance(case.expected, str):
            recurring.setdefault(_norm(case.expected), set()).add(case.case_id)
    common = {text: ids for text, ids in recurring.items() if text and len(ids) >= MIN_RECURRING}
    locations: list[str] = []
    ids: set[str] = set()
    for item in added:
        code = code_text(item.path, item.text)
        if not _MATCHING.search(code):
            continue
        for match in _STRING.finditer(code):
            literal = _norm(match.group(1) if match.group(1) is not None else match.group(2))
            if literal in common:
                locations.append(f"{item.path}:{item.line}")
                ids |= common[literal]
    if not locations:
        return []
    return [
        Finding(
            "string_matching_rule",
            f"{len(locations)} added comparisons against answer texts that recur on "
            f"{len(ids)} cases",
            (),
            tuple(sorted(ids)),
            tuple(dict.fromkeys(locations)),
        )
    ]


def detect(
    candidate: Sequence[TrialFacts],
    base: Sequence[TrialFacts],
    cases: Mapping[str, CaseFacts],
    added: Sequence[AddedLine],
) -> list[Finding]:
    """Every detector, in the order of :data:`CATEGORIES`."""
    return [
        *no_model_call(candidate, base),
        *constant_answer(candidate, cases),
        *answer_not_from_model(candidate, base),
        *keyed_tables(added, cases),
        *string_matching_rules(added, candidate, cases),
    ]


def _splits(ids: Sequence[str], cases: Mapping[str, CaseFacts]) -> str:
    counts: dict[str, int] = {}
    for c in ids:
        split = cases[c].split if c in cases else "?"
        counts[split] = counts.get(split, 0) + 1
    return ", ".join(f"{n} {split}" for split, n in sorted(counts.items()))


def _location_order(location: str) -> tuple[str, int]:
    path, _, line = location.rpartition(":")
    return path, int(line)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
