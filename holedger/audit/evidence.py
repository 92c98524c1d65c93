"""What an audit reads of a task and a candidate: cases and their tags, the held-out
strata, the lines a candidate adds, its diff, and the answers of trials."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from holedger.audit import compute, detectors, stats
from holedger.audit.facts import RunFacts, RunStore, Trial, answer_of, read_run
from holedger.server.candidates import CandidateRepo


def case_facts(task_ref: str) -> dict[str, detectors.CaseFacts]:
    """Every case of the task (all splits) with its expected answer; {} when the task
    cannot be loaded as a holedger task folder."""
    try:
        from holedger.tasks import load_task

        loaded = load_task(task_ref)
    except Exception:  # a task given by a loader of its own (tests), or gone
        return {}
    out = {}
    for split in ("dev", "val", "test"):
        for case in loaded.cases(split):
            out[case.id] = detectors.CaseFacts(case.id, split, case.input, case.expected)
    return out


def case_tags(task_ref: str) -> dict[str, list[str]]:
    """Each case's artifact or type tags (B6), from its input."""
    return {c.case_id: stats.case_tags(c.input) for c in case_facts(task_ref).values()}


def held_out(
    ledger: RunStore, run: RunFacts, cases: dict[str, detectors.CaseFacts]
) -> dict[str, list[dict[str, Any]]]:
    """B6 on the held-out split (the run's and its seed-baseline run's RunScored) and the
    types the task's search splits leave out."""
    baseline = None
    if run.baseline_run is not None and ledger.has_run(run.baseline_run):
        baseline = read_run(run.baseline_run, ledger.records(run.baseline_run))
    tags = {c.case_id: stats.case_tags(c.input) for c in cases.values()}
    search = {t for c in cases.values() if c.split in ("dev", "val") for t in tags[c.case_id]}
    return compute.held_out_strata(run, baseline, tags, search)


def added_lines(repo: CandidateRepo, base: str, candidate: str) -> list[detectors.AddedLine]:
    """Lines ``candidate`` adds to ``base``, file by file (text files only)."""
    old, new = repo.files(base), repo.files(candidate)
    return lines_added({p: f.data for p, f in old.items()}, {p: f.data for p, f in new.items()})


def lines_added(old: dict[str, bytes], new: dict[str, bytes]) -> list[detectors.AddedLine]:
    """Lines the file map ``new`` adds to ``old`` (text files only), with line numbers."""
    out = []
    for path in sorted(new):
        if old.get(path) == new[path]:
            continue
        try:
            after = new[path].decode("utf-8").splitlines()
            before = old[path].decode("utf-8").splitlines() if path in old else []
        except UnicodeDecodeError:
            continue
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        for tag, _, _, j1, j2 in matcher.get_opcodes():
            if tag in ("replace", "insert"):
                out += [detectors.AddedLine(path, j + 1, after[j]) for j in range(j1, j2)]
    return out


def unified_diff(repo: CandidateRepo, base: str, candidate: str) -> str:
    old, new = repo.files(base), repo.files(candidate)
    lines: list[str] = []
    for path in sorted(set(old) | set(new)):
        a = old[path].data.decode("utf-8", "replace").splitlines() if path in old else []
        b = new[path].data.decode("utf-8", "replace").splitlines() if path in new else []
        if a != b:
            lines += difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", lineterm="")
    return "\n".join(lines) + ("\n" if lines else "")


def answers_for(ledger: RunStore, trials: Sequence[Trial]) -> dict[str, Any]:
    return {
        t.trial_id: answer_of(ledger.get_blob(t.answer_digest) if t.answer_digest else None)
        for t in trials
    }
