"""A run's seed: the task's own seed folder, or one of its seed variants.

A task may ship seed variants (``variants/NAME/``, :mod:`holedger.tasks.variants`): the
same harness written against another provider's SDK. A run opened on a variant starts
from that tree: its terms record ``seed_variant`` and, as ``seed_commit``, the commit of
the variant tree (the task pins only its own seed's commit), so everything that starts
from the seed (candidate 0, the seed baseline, replay's checks) is that variant.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

from holedger.errors import NotFoundError, UsageError
from holedger.schemas.events import TaskTerms
from holedger.server.candidates import CandidateRepo, FileMap, TreeLimits, read_directory
from holedger.server.taskview import ServerTask
from holedger.tasks.variants import seed_variants, write_variant


@dataclass(frozen=True)
class RunSeed:
    files: FileMap
    commit: str  # what the run's commit 0 will be
    variant: str | None

    def terms(self, task_terms: TaskTerms) -> TaskTerms:
        """The terms a run from this seed pins."""
        if self.variant is None:
            return task_terms
        return task_terms.model_copy(
            update={"seed_commit": self.commit, "seed_variant": self.variant}
        )


def run_seed(task: ServerTask, variant: str | None, limits: TreeLimits) -> RunSeed:
    """The files and commit of the seed a run of ``task`` starts from."""
    if variant is None:
        return RunSeed(read_directory(task.seed_dir, limits), task.terms.seed_commit, None)
    if task.root is None:
        raise UsageError(f"task {task.terms.task_id} has no folder to hold seed variants")
    if variant not in seed_variants(task.root):
        known = ", ".join(seed_variants(task.root)) or "none"
        raise NotFoundError(
            f"task {task.terms.task_id} has no seed variant {variant!r}",
            hint=f"its seed variants: {known}",
        )
    with tempfile.TemporaryDirectory(prefix="holedger-variant-") as tmp:
        tree = write_variant(task.root, task.seed_dir, variant, Path(tmp) / "seed")
        files = read_directory(tree, limits)
        commit = CandidateRepo(Path(tmp) / "seed.git").commit(files, None).commit
    return RunSeed(files, commit, variant)


def with_run_seed(task: ServerTask, opened: TaskTerms) -> ServerTask:
    """``task`` with the seed its run pinned (a variant's commit, when it has one)."""
    if opened.seed_variant is None:
        return task
    terms = task.terms.model_copy(
        update={"seed_commit": opened.seed_commit, "seed_variant": opened.seed_variant}
    )
    return dataclasses.replace(task, terms=terms)
