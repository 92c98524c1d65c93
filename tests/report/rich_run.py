"""A run with everything the page can show: a real candidate repository whose candidates
are a task's prepared edits, a seed-baseline run in the same ledger with per-case scores,
an optimizer log beside the page, and untrusted text in a safety violation."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pygit2
from sample_terms import sha

from holedger.ledger.store import Ledger
from holedger.replay.html import Sources
from holedger.schemas.events import CaseScores, RunScored

from .synthetic_run import E_H0, case_ids, record_synthetic_run, terms

SEED_MAIN = "MAX_RETRIES = 0\nTIMEOUT_S = 30.0\nPROMPT = 'answer'\n"
EDIT_TOML = """description = "Retry transient upstream errors."
lever = "retry_timeout"

[[replace]]
path = "harness/__main__.py"
old = '''MAX_RETRIES = 0
TIMEOUT_S = 30.0'''
new = '''MAX_RETRIES = 4
TIMEOUT_S = 20.0'''
"""
HOSTILE = "<script>alert(1)</script> \x1b[31mred\x1b[0m dns \x07name"


@dataclass(frozen=True)
class RichRun:
    run_id: str
    baseline_run_id: str
    sources: Sources
    commits: list[str]


def _commit(repo: pygit2.Repository, files: dict[str, str], parent: str | None, msg: str) -> str:
    builder = repo.TreeBuilder()
    sub = repo.TreeBuilder()
    for path, text in files.items():
        name = path.split("/", 1)[1]
        sub.insert(name, repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
    builder.insert("harness", sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("holedger", "holedger@localhost", 0, 0)
    parents = [pygit2.Oid(hex=parent)] if parent else []
    return str(repo.create_commit(None, sig, sig, msg, builder.write(), parents))


def record_rich_run(ledger: Ledger, where: Path) -> RichRun:
    repo = pygit2.init_repository(str(where / "run.git"), bare=True)
    seed_files = {"harness/__main__.py": SEED_MAIN}
    seed = _commit(repo, seed_files, None, "seed")
    edited = {
        "harness/__main__.py": SEED_MAIN.replace("= 0\nTIMEOUT_S = 30.0", "= 4\nTIMEOUT_S = 20.0")
    }
    first = _commit(repo, edited, seed, "retry")
    second_files = {**edited, "harness/extra.py": "def helper():\n    return 42\n"}
    second = _commit(repo, second_files, first, "by hand")
    edits = where / "edits" / "03-retry-policy"
    edits.mkdir(parents=True)
    (edits / "edit.toml").write_text(EDIT_TOML)

    # the seed-baseline run: its RunScored holds the seed's per-case test scores (K = 2)
    baseline_id = ledger.open_run(
        terms(), task_digest=sha("synthetic task"), optimizer="seed-baseline"
    )
    four_ninths = Fraction(4, 9)  # 2 cases [1, 0] and 3 cases [0, 4/9]: E(H0) = 1/3
    per_case = [
        CaseScores(
            case_id=c,
            scores=[Fraction(1), Fraction(0)] if i % 3 == 0 else [Fraction(0), four_ninths],
        )
        for i, c in enumerate(case_ids("test"))
    ]
    ledger.append(
        baseline_id,
        "RunScored",
        RunScored(candidate=seed, k=2, per_case=per_case, e_h_plus=E_H0, e_h0=E_H0, g=Fraction(0)),
        "server",
    )
    run_id = record_synthetic_run(
        ledger, commits=[seed, first, second], baseline_run_id=baseline_id, safety_detail=HOSTILE
    )
    log = where / f"{run_id}.optimizer.jsonl"
    log.write_text('{"say": "seed: dev mean 0.167"}\n{"say": "nominate #2"}\n')
    return RichRun(
        run_id, baseline_id, Sources(where / "run.git", where / "edits", log), [seed, first, second]
    )
