"""The leakage audit: what the optimizer was shown holds no test data; candidates hold none.

Two parts, each a named check:

``leakage`` lists every projection the optimizer was shown, by digest, and scans each
body (canonical JSON) and the blobs it names (answers, traces, which the optimizer may
fetch) for test-split content. It needs the task's cases (see ``taskdata``); without
them the audit is reported as skipped with the reason, which is not a failure.

``candidate_scan`` reads every committed candidate from the run's bare repository
(``CheckInputs.run_repo``, or ``CheckInputs.repos`` of the run id) and reports, with
file and line, test content that a candidate added over what the seed ships. Test
content in the nominated candidate voids the score: it fails the check (as does a
recorded tree that differs from the repository's). In candidates that were not
nominated it is reported under the warning-level ``candidate_scan_unnominated``: the
optimizer tried, but the scored candidate is clean.

Matching rules (chosen so that chance hits in ordinary code are not called leaks):

* a *test case id* matches as a whole token (not inside a longer id);
* a *test input* is each string in a test case's input of at least
  ``MIN_INPUT_CHARS`` characters that is not also in a dev or val input; it matches as a
  substring;
* a *test answer* is each scalar in a test case's expected answer that is distinctive
  (a number with at least ``MIN_ANSWER_DIGITS`` digits, any other text with at least
  ``MIN_ANSWER_CHARS`` characters) and is not also in a dev or val expected answer (so
  answer kinds and tolerances drop out); it matches as a whole token (``681`` does not
  match ``6810``, ``6.81`` or ``4,681``), and text is also read with thousands
  separators removed (``4,640`` is ``4640``);
* in a candidate file, test content that also appears anywhere in the seed tree (e.g. the
  task's own corpus, from which answers are derived) is not evidence, and only files
  whose content differs from the seed's are read;
* a finding is a file (or projection) holding any test case id or test input (a
  *per-item gate*), or at least ``MIN_DISTINCT_ANSWERS`` distinct test answers; with
  ``MIN_DISTINCT_ANSWERS`` or more distinct items in all it is called a *lookup table*.
  The answers in a dev projection, the answer blobs and the traces are scanned for case
  ids and inputs only: they are the harness's own output, where numbers from the corpus
  occur by chance (test answers there would be the candidate's doing, which the
  candidate scan looks for).

Findings name test cases by id (``answer of oql-test-007``), never by their answer, so
the report itself leaks nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.replay.taskdata import TaskData, task_data
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    DisclosureProjected,
    Model,
)

LEAKAGE = "leakage"
SCAN = "candidate_scan"
SCAN_OTHERS = "candidate_scan_unnominated"
MIN_INPUT_CHARS = 24
MIN_ANSWER_DIGITS = 3
MIN_ANSWER_CHARS = 4
MIN_DISTINCT_ANSWERS = 3
MAX_FILE_BYTES = 1 << 20
MAX_LISTED = 100
NUMBER = re.compile(r"^[+-]?[0-9]+(\.[0-9]+)?$")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


# --------------------------------------------------------------------------- matching


@dataclass(frozen=True)
class Item:
    """One piece of test content: ``kind`` is "case id", "input" or "answer"."""

    kind: str
    cases: tuple[str, ...]

    def label(self) -> str:
        more = f" (+{len(self.cases) - 1})" if len(self.cases) > 1 else ""
        if self.kind == "case id":
            return f"case id {self.cases[0]}"
        return f"{self.kind} of {self.cases[0]}{more}"


def _distinctive(answer: str) -> bool:
    """Numbers need ``MIN_ANSWER_DIGITS`` digits, other answers ``MIN_ANSWER_CHARS``."""
    if NUMBER.match(answer):
        return sum(ch.isdigit() for ch in answer) >= MIN_ANSWER_DIGITS
    return len(answer) >= MIN_ANSWER_CHARS


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str):
        yield value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        yield str(value)


def _alternation(values: Iterable[str], left: str, right: str) -> re.Pattern[str] | None:
    ordered = sorted(set(values), key=lambda v: (-len(v), v))
    if not ordered:
        return None
    return re.compile(left + "(" + "|".join(re.escape(v) for v in ordered) + ")" + right)


class Matcher:
    """Finds test content in text, by the rules in the module docstring."""

    def __init__(self, data: TaskData) -> None:
        search = data.splits.get("dev", []) + data.splits.get("val", [])
        search_inputs = {s for c in search for s in _leaves(c.input)}
        search_answers = {s for c in search for s in _leaves(c.expected)}
        self.ids: dict[str, Item] = {}
        inputs: dict[str, list[str]] = {}
        answers: dict[str, list[str]] = {}
        for case in data.splits.get("test", []):
            self.ids[case.id] = Item("case id", (case.id,))
            for text in set(_leaves(case.input)):
                if len(text) >= MIN_INPUT_CHARS and text not in search_inputs:
                    inputs.setdefault(text, []).append(case.id)
            for text in set(_leaves(case.expected)):
                if _distinctive(text) and text not in search_answers:
                    answers.setdefault(text, []).append(case.id)
        self.inputs = {t: Item("input", tuple(ids)) for t, ids in inputs.items()}
        self.answers = {t: Item("answer", tuple(ids)) for t, ids in answers.items()}
        self._id_re = _alternation(self.ids, r"(?<![A-Za-z0-9_.-])", r"(?![A-Za-z0-9_-])")
        self._answer_re = _alternation(self.answers, r"(?<![\w.])(?<!\d,)", r"(?![\w]|[.,]\d)")

    def find(self, text: str, *, answers: bool = True) -> set[Item]:
        found = self._find(text, answers)
        plain = THOUSANDS.sub("", text)  # "4,640" is the number 4640 too
        return found | self._find(plain, answers) if plain != text else found

    def _find(self, text: str, answers: bool) -> set[Item]:
        found: set[Item] = set()
        if self._id_re is not None:
            found.update(self.ids[m.group(1)] for m in self._id_re.finditer(text))
        found.update(item for needle, item in self.inputs.items() if needle in text)
        if answers and self._answer_re is not None:
            found.update(self.answers[m.group(1)] for m in self._answer_re.finditer(text))
        return found


def verdict(items: set[Item]) -> str | None:
    """None when ``items`` is no evidence; else "per-item gate" or "lookup table"."""
    strong = [i for i in items if i.kind != "answer"]
    answers = [i for i in items if i.kind == "answer"]
    if not strong and len(answers) < MIN_DISTINCT_ANSWERS:
        return None
    return "lookup table" if len(items) >= MIN_DISTINCT_ANSWERS else "per-item gate"


# --------------------------------------------------------------------------- projection


@dataclass
class _Shown:
    seq: int
    request_id: str
    split: str
    policy: str
    digest: str
    body: dict[str, Any]
    blobs: list[str] = field(default_factory=list)


def _split_answers(body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The body without the harness's own answers, and those answers.

    A dev trial's ``answer`` is what the candidate printed for a dev case; numbers from
    the task's corpus turn up there by chance, so it is scanned for case ids and inputs
    only, like the trace blobs. Everything else in the body is the server's own words.
    """
    answers: list[Any] = []
    cases = body.get("cases")
    if not isinstance(cases, dict):
        return body, answers
    stripped: dict[str, Any] = {}
    for case_id, entry in cases.items():
        trials = entry.get("trials") if isinstance(entry, dict) else None
        if not isinstance(trials, list):
            stripped[case_id] = entry
            continue
        kept = []
        for trial in trials:
            if isinstance(trial, dict) and "answer" in trial:
                answers.append(trial["answer"])
                trial = {**trial, "answer": None}
            kept.append(trial)
        stripped[case_id] = {**entry, "trials": kept}
    return {**body, "cases": stripped}, answers


class LeakageFold:
    name = "leakage"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.shown: list[_Shown] = []
        self.candidates: list[CandidateCommitted] = []
        self.committed_at: dict[str, int] = {}
        self.nominated: str | None = None

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, DisclosureProjected):
            self.shown.append(
                _Shown(
                    rec.seq,
                    payload.request_id,
                    payload.split,
                    payload.policy,
                    payload.projection_digest,
                    payload.projection,
                    sorted(rules.fetchable_digests(payload.projection)),
                )
            )
        elif isinstance(payload, CandidateCommitted):
            self.candidates.append(payload)
            self.committed_at.setdefault(payload.candidate, rec.seq)
        elif isinstance(payload, CandidateNominated) and self.nominated is None:
            self.nominated = payload.candidate

    def finish(self, out: ReportBuilder) -> None:
        out.declare(LEAKAGE, "nothing shown to the optimizer holds test data")
        out.declare(SCAN, "the nominated candidate hard-codes no test answers or case ids")
        data = task_data(self.ctx)
        section: dict[str, Any] = {
            "shown": [
                {
                    "seq": s.seq,
                    "request_id": s.request_id,
                    "split": s.split,
                    "policy": s.policy,
                    "digest": s.digest,
                    "blobs": s.blobs,
                }
                for s in self.shown
            ],
            "rules": {
                "min_input_chars": MIN_INPUT_CHARS,
                "min_answer_digits": MIN_ANSWER_DIGITS,
                "min_answer_chars": MIN_ANSWER_CHARS,
                "min_distinct_answers": MIN_DISTINCT_ANSWERS,
            },
        }
        if isinstance(data, str):
            repo = self._repo_path()
            section["audit"] = {"status": "skipped", "reason": data}
            section["candidate_scan"] = {
                "status": "skipped",
                "reason": data,
                "repository_found": repo is not None and repo.exists(),
            }
            out.check(LEAKAGE, True, f"audit skipped: {data}")
            out.check(SCAN, True, f"scan skipped: {data}")
            out.section("leakage", section)
            return
        matcher = Matcher(data)
        section["audit"] = self._audit(matcher, out)
        section["candidate_scan"] = self._scan(matcher, out)
        out.section("leakage", section)

    def _audit(self, matcher: Matcher, out: ReportBuilder) -> dict[str, Any]:
        findings = []
        unscanned: set[str] = set()
        for shown in self.shown:
            server_part, harness_part = _split_answers(shown.body)
            items = matcher.find(canonical_json(server_part).decode("utf-8"))
            items |= matcher.find(canonical_json(harness_part).decode("utf-8"), answers=False)
            for digest in shown.blobs:
                data = self.ctx.blobs.blob(digest)
                if data is None:
                    unscanned.add(digest)
                    continue
                items |= matcher.find(data.decode("utf-8", "replace"), answers=False)
            kind = verdict(items)
            if kind is None:
                continue
            labels = sorted(i.label() for i in items)
            findings.append({"seq": shown.seq, "request_id": shown.request_id, "items": labels})
            out.fail(
                shown.seq,
                "DisclosureProjected",
                f"projection of {shown.request_id} holds test data: {', '.join(labels[:5])}",
                check=LEAKAGE,
            )
        if not findings:
            out.check(
                LEAKAGE,
                True,
                f"{counted(len(self.shown), 'projection')} shown, none holds a test case id, input "
                f"or answer ({counted(len(matcher.ids), 'test case')} checked)"
                + (
                    f"; {counted(len(unscanned), 'blob')} it names (answers, traces) "
                    "redacted: not scanned"
                    if unscanned
                    else ""
                ),
            )
        return {
            "status": "done",
            "projections": len(self.shown),
            "findings": findings,
            "unscanned_blobs": len(unscanned),
        }

    def _repo_path(self) -> Path | None:
        inputs = self.ctx.inputs
        if inputs.run_repo is not None:
            return Path(inputs.run_repo)
        if inputs.repos is not None:
            return Path(inputs.repos(self.ctx.run_id))
        return None

    def _scan(self, matcher: Matcher, out: ReportBuilder) -> dict[str, Any]:
        path = self._repo_path()
        if path is None or not path.exists():
            reason = (
                "no candidate repository given"
                if path is None
                else f"the run's candidate repository {path.name} is not here"
            )
            out.check(SCAN, True, f"scan skipped: {reason}")
            return {"status": "skipped", "reason": reason}
        scan = CandidateScan(path, matcher)
        seed = self.ctx.opened.terms.seed_commit
        if not scan.has(seed) and self.candidates:
            seed = self.candidates[0].candidate
        scan.set_seed(seed)
        for committed in self.candidates:
            problem = scan.scan(committed)
            if problem:
                seq = self.committed_at.get(committed.candidate)
                out.fail(seq, "CandidateCommitted", problem, check=SCAN)
        nominated = [f for f in scan.findings if f["candidate"] == self.nominated]
        others = [f for f in scan.findings if f["candidate"] != self.nominated]
        for finding in nominated:
            seq = self.committed_at.get(finding["candidate"])
            out.fail(seq, "CandidateCommitted", _finding_line(finding), check=SCAN)
        if not nominated and not scan.problems:
            out.check(
                SCAN,
                True,
                f"{counted(len(self.candidates), 'candidate')} scanned "
                f"({counted(scan.files, 'changed file')}): "
                + (
                    "the nominated one holds no test answers or case ids"
                    if self.nominated is not None
                    else "none nominated yet"
                ),
            )
        if others:
            more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
            out.warn(SCAN_OTHERS, False, _finding_line(others[0]) + more)
        elif self.candidates:
            out.warn(SCAN_OTHERS, True, "no candidate holds test answers or case ids")
        return {
            "status": "done",
            "candidates": len(self.candidates),
            "files_scanned": scan.files,
            "findings": scan.findings[:MAX_LISTED],
            "problems": scan.problems,
        }


def _finding_line(finding: dict[str, Any]) -> str:
    return (
        f"candidate {finding['candidate'][:12]} {finding['file']}: {finding['kind']} "
        f"({finding['items']} test items, first at line {finding['lines'][0]['line']})"
    )


# --------------------------------------------------------------------------- candidates


class CandidateScan:
    """Scans committed candidate trees of one bare repository against the seed's tree."""

    def __init__(self, path: Path, matcher: Matcher) -> None:
        import pygit2

        self.repo = pygit2.Repository(str(path))
        self.matcher = matcher
        self.seed_blobs: dict[str, str] = {}
        self.seed_items: set[Item] = set()
        self.scanned: dict[str, list[tuple[int, set[Item]]]] = {}
        self.findings: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.files = 0

    def has(self, commit_id: str) -> bool:
        return self._commit(commit_id) is not None

    def _commit(self, commit_id: str) -> Any:
        import pygit2

        try:
            obj = self.repo.get(commit_id)
        except (ValueError, KeyError):
            return None
        return obj if isinstance(obj, pygit2.Commit) else None

    def _files(self, tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
        import pygit2

        for entry in tree:
            name = f"{prefix}{entry.name}"
            obj = self.repo.get(entry.id)
            if isinstance(obj, pygit2.Tree):
                yield from self._files(obj, name + "/")
            elif isinstance(obj, pygit2.Blob):
                yield name, obj

    def _text(self, blob: Any) -> str | None:
        if blob.size > MAX_FILE_BYTES or blob.is_binary:
            return None
        data: bytes = blob.data
        return data.decode("utf-8", "replace")

    def set_seed(self, seed: str) -> None:
        commit = self._commit(seed)
        if commit is None:
            self.problems.append(f"seed commit {seed[:12]} is not in the repository")
            return
        for name, blob in self._files(commit.tree):
            self.seed_blobs[name] = str(blob.id)
            text = self._text(blob)
            if text is not None:
                self.seed_items |= self.matcher.find(text)

    def scan(self, committed: CandidateCommitted) -> str | None:
        commit = self._commit(committed.candidate)
        if commit is None:
            problem = f"candidate {committed.candidate[:12]} is not in the repository"
            self.problems.append(problem)
            return problem
        if str(commit.tree_id) != committed.tree:
            problem = (
                f"candidate {committed.candidate[:12]} has tree {str(commit.tree_id)[:12]} "
                f"in the repository, {committed.tree[:12]} in the log"
            )
            self.problems.append(problem)
            return problem
        for name, blob in self._files(commit.tree):
            oid = str(blob.id)
            if self.seed_blobs.get(name) == oid:
                continue
            lines = self.scanned.get(oid)
            if lines is None:
                lines = self._scan_blob(blob)
                self.scanned[oid] = lines
                self.files += 1
            items = set().union(*(found for _, found in lines)) if lines else set()
            kind = verdict(items)
            if kind is None:
                continue
            self.findings.append(
                {
                    "candidate": committed.candidate,
                    "index": committed.index,
                    "file": name,
                    "kind": kind,
                    "items": len(items),
                    "lines": [
                        {"line": number, "matches": sorted(i.label() for i in found)}
                        for number, found in lines[:MAX_LISTED]
                    ],
                }
            )
        return None

    def _scan_blob(self, blob: Any) -> list[tuple[int, set[Item]]]:
        text = self._text(blob)
        if text is None:
            return []
        result = []
        for number, line in enumerate(text.splitlines(), start=1):
            found = self.matcher.find(line) - self.seed_items
            if found:
                result.append((number, found))
        return result
