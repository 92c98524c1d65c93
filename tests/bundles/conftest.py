"""Fixtures for the bundle tests: a recorded run with real candidate git history.

The run is written through the Ledger API into SQLite (and, marked ``postgres``, into a
fresh PostgreSQL database at 127.0.0.1:5432 that is dropped afterwards). Its candidates
are real commits in the run's bare repository (Settings.run_repo), under
``refs/candidates/<id>`` as the server room keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest
from pgdb import fresh_database
from sample_terms import sha, task_terms

from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.schemas.events import (
    CandidateCommitted,
    SafetyViolation,
    TaskTerms,
)

CHECKPOINT_INTERVAL = 8


def terms() -> TaskTerms:
    return task_terms("bundle-task")


@dataclass
class SampleRun:
    settings: Settings
    ledger: Ledger
    key: SigningKey
    run_id: str
    commits: list[str]
    blobs: list[str]

    @property
    def repo(self) -> Path:
        return self.settings.run_repo(self.run_id)


def _commit(
    repo: pygit2.Repository, files: dict[str, bytes], parent: str | None
) -> tuple[str, str]:
    builder = repo.TreeBuilder()
    sub = repo.TreeBuilder()
    for name, data in sorted(files.items()):
        if "/" in name:
            sub.insert(name.split("/", 1)[1], repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
        else:
            builder.insert(name, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
    builder.insert("harness", sub.write(), pygit2.GIT_FILEMODE_TREE)
    tree = builder.write()
    sig = pygit2.Signature("holedger", "holedger@localhost", 0, 0)
    parents = [pygit2.Oid(hex=parent)] if parent else []
    oid = repo.create_commit(None, sig, sig, "candidate", tree, parents)
    repo.references.create(f"refs/candidates/{oid}", oid)
    return str(oid), str(tree)


def record_sample(
    ledger: Ledger, settings: Settings, candidates: int = 4, pad: int = 20
) -> SampleRun:
    """RunOpened, real git candidates, blob-carrying safety events, RunClosed."""
    run_id = ledger.open_run(terms(), task_digest=sha("bundle-task"), optimizer="bundle-test")
    repo = pygit2.init_repository(str(settings.run_repo(run_id)), bare=True)
    parent: str | None = None
    commits: list[str] = []
    blobs: list[str] = []
    for i in range(candidates):
        files = {"README.md": b"seed\n", "harness/agent.py": f"VERSION = {i}\n".encode()}
        commit, tree = _commit(repo, files, parent)
        ledger.append(
            run_id,
            "CandidateCommitted",
            CandidateCommitted(
                candidate=commit,
                index=i,
                tree=tree,
                parent=parent,
                changed_paths=["harness/agent.py"] if parent else ["README.md", "harness/agent.py"],
                immutable_ok=True,
            ),
            "server",
        )
        commits.append(commit)
        parent = commit
    for i in range(pad):
        evidence = ledger.put_blob(f"evidence {i} of {run_id}".encode())
        blobs.append(evidence)
        ledger.append(
            run_id,
            "SafetyViolation",
            SafetyViolation(
                category="readonly_write",
                trial_id=f"trial-{i}",
                detail="write to a read-only path",
                evidence_digest=evidence,
            ),
            "sandbox",
        )
    ledger.close_run(run_id, reason="completed", summary={"candidates": candidates})
    return SampleRun(settings, ledger, ledger.signers["server"], run_id, commits, blobs)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SampleRun]:
    home = tmp_path_factory.mktemp("home")
    settings = Settings.resolve(home)
    Ledger.init_home(settings)
    ledger = Ledger.from_settings(settings, checkpoint_interval=CHECKPOINT_INTERVAL)
    yield record_sample(ledger, settings)
    ledger.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session (dropped afterwards)."""
    yield from fresh_database("holedger_bundles")
