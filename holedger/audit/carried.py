"""What recomputing an audit's findings and B6 strata reads besides the logs: the task's
cases (ids, inputs, expected answers, tags) and the files of the seed and of H^.

Each is pinned to what the audited run signed before anything is recomputed from it:

* the task by RunOpened's ``task_digest``: the spec's canonical JSON hashes to it, and
  each split's cases hash to the split digest the spec holds (docs/FORMAT.md, "Task and
  manifest digests");
* a candidate's files by the git tree id its CandidateCommitted names: the files, written
  as a git tree, hash to it.

Verifying an audit in a home reads them there (the task the run was opened with, the
run's candidate repository: :func:`from_home`); an audits bundle carries them
(:func:`bundle_lines`, entries ``task``, ``tree`` and ``git_blob``) and verifying it
reads them from the file (:func:`from_bundle`). Either way the check ``evidence`` says
whether they are the run's; what is not at hand is said, and the numbers needing it are
reported as not recomputed.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from holedger.audit.detectors import CaseFacts
from holedger.audit.facts import RunFacts
from holedger.config import Settings
from holedger.errors import HoledgerError
from holedger.schemas.task import SPLITS, TaskSpec
from holedger.server.candidates import CandidateRepo, FileEntry, FileMap, write_tree
from holedger.tasks.digests import case_digest, json_digest, split_digest

NOT_CARRIED = "the bundle carries no task and no candidate trees (written before bundles did)"


@dataclass
class Evidence:
    """The task's cases and the candidates' files, where they come from, and whether they
    are the ones the run signed (``problems``) or at hand at all (``missing``)."""

    where: str  # "in the home" or "in the bundle"
    cases: dict[str, CaseFacts] = field(default_factory=dict)
    files: dict[str, FileMap] = field(default_factory=dict)  # commit -> its files
    task: dict[str, Any] | None = None  # the pinned spec and cases, as carried
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def tree(self, commit: str) -> dict[str, bytes] | None:
        got = self.files.get(commit)
        return None if got is None else {path: entry.data for path, entry in got.items()}

    def detail(self) -> str:
        held = [f"the task ({len(self.cases)} cases)"] if self.cases else []
        held += [f"{len(self.files)} candidate trees"] if self.files else []
        if not held:
            return "nothing to pin: " + "; ".join(self.missing)
        return f"{' and '.join(held)} {self.where}: the ones the run signed"

    def take_task(self, run: RunFacts, spec: Any, cases: Any) -> None:
        """Take the task if it is the run's: its spec hashes to the task digest and each
        split's cases to the split digest the spec holds."""
        what = f"the task {self.where}"
        if not isinstance(spec, dict) or json_digest(spec) != run.task_digest:
            self.problems.append(
                f"{what} is not the run's: its spec does not hash to the task digest "
                f"{run.task_digest[:16]} of RunOpened"
            )
            return
        facts: dict[str, CaseFacts] = {}
        try:
            pinned = TaskSpec.model_validate(spec).splits.split_digests
            for split in SPLITS:
                records = sorted(cases[split], key=lambda r: str(r["id"]))
                if split_digest((r["id"], case_digest(r)) for r in records) != pinned[split]:
                    self.problems.append(
                        f"{what} is not the run's: its {split} cases do not hash to the "
                        "split digest its spec pins"
                    )
                    return
                for r in records:
                    facts[str(r["id"])] = CaseFacts(str(r["id"]), split, r["input"], r["expected"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.problems.append(f"{what} is not a task's spec and cases ({exc})")
            return
        self.cases = facts
        self.task = {"spec": spec, "cases": cases}

    def take_tree(self, run: RunFacts, commit: str, files: FileMap) -> None:
        """Take ``commit``'s files if they hash to the tree its CandidateCommitted names."""
        signed = run.trees.get(commit, "")
        try:
            got = tree_id(files)
        except (ValueError, HoledgerError) as exc:
            got = f"nothing ({exc})"
        if got != signed:
            self.problems.append(
                f"the files of {commit[:12]} {self.where} are not the tree the run committed: "
                f"they hash to {got[:16]}, CandidateCommitted names {signed[:16]}"
            )
            return
        self.files[commit] = files


def tree_id(files: FileMap) -> str:
    """The git tree id of ``files`` (as the run's repository writes it)."""
    if not files:
        raise ValueError("no file")
    with tempfile.TemporaryDirectory(prefix="holedger-tree-") as tmp:
        repo = pygit2.init_repository(str(Path(tmp) / "t.git"), bare=True)
        return str(write_tree(repo, files))


def commits(run: RunFacts) -> list[str]:
    """The candidates whose files the detectors read: the seed, and H^."""
    return [run.seed_commit] + ([run.nominee] if run.nominee not in (None, run.seed_commit) else [])


def from_home(settings: Settings, run: RunFacts) -> Evidence:
    """The task the run was opened with and the run's candidates, read in the home."""
    from holedger.server.service import RunConfig
    from holedger.tasks import load_task

    evidence = Evidence("in the home")
    try:
        loaded = load_task(RunConfig.load(settings, run.run_id).task)
        spec = loaded.spec.model_dump(mode="json")
        cases = {split: [c.record() for c in loaded.cases(split)] for split in SPLITS}
    except Exception:  # no task folder in this home (or a loader of its own, in tests)
        evidence.missing.append("the task is not at hand")
    else:
        evidence.take_task(run, spec, cases)
    path = settings.run_repo(run.run_id)
    if not (path / "HEAD").exists():
        evidence.missing.append("the run's candidate repository is not at hand")
        return evidence
    repo = CandidateRepo(path)
    for commit in commits(run):
        try:
            files = repo.files(commit)
        except Exception:  # a commit the repository lacks
            evidence.missing.append(f"candidate {commit[:12]} is not in the run's repository")
            continue
        evidence.take_tree(run, commit, files)
    return evidence


def bundle_lines(evidence: Evidence, run: RunFacts) -> list[dict[str, Any]]:
    """The audits bundle entries carrying what ``evidence`` holds of the run: the task
    under its task digest, each tree under its git tree id, each file once by its git
    blob id."""
    lines: list[dict[str, Any]] = []
    if evidence.task is not None:
        lines.append({"task": run.task_digest, **evidence.task})
    blobs: dict[str, bytes] = {}
    for commit, files in evidence.files.items():
        listing = []
        for path, entry in sorted(files.items()):
            oid = str(pygit2.hash(entry.data))
            blobs[oid] = entry.data
            listing.append([path, oid, entry.executable])
        lines.append({"tree": run.trees[commit], "files": listing})
    lines += [
        {"git_blob": oid, "data": base64.b64encode(data).decode("ascii")}
        for oid, data in sorted(blobs.items())
    ]
    return lines


def from_bundle(
    tasks: Mapping[str, Any],
    trees: Mapping[str, Any],
    blobs: Mapping[str, bytes],
    run: RunFacts,
) -> Evidence:
    """The task and candidate trees an audits bundle carries for ``run``, pinned."""
    evidence = Evidence("in the bundle")
    if not tasks and not trees:
        evidence.missing.append(NOT_CARRIED)
        return evidence
    task = tasks.get(run.task_digest)
    if task is None:
        evidence.missing.append(f"the bundle carries no task of digest {run.task_digest[:16]}")
    else:
        evidence.take_task(run, task.get("spec"), task.get("cases"))
    for commit in commits(run):
        listing = trees.get(run.trees.get(commit, ""))
        if listing is None:
            evidence.missing.append(f"the bundle carries no tree of candidate {commit[:12]}")
            continue
        try:
            files = {str(p): FileEntry(blobs[str(oid)], bool(x)) for p, oid, x in listing}
        except (KeyError, TypeError, ValueError) as exc:
            evidence.problems.append(
                f"the tree of {commit[:12]} in the bundle lacks a file's content ({exc})"
            )
            continue
        evidence.take_tree(run, commit, files)
    return evidence
