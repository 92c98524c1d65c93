"""What the server needs of a task, adapted from holedger.tasks.

The server reads a task through this one narrow view: its pinned terms and digest, the
seed folder, the cases of a split (input for the harness; the expected answer stays in
this process) and the verifier. ``load_server_task`` adapts ``holedger.tasks.load_task``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from holedger.errors import NotFoundError
from holedger.schemas.events import TaskTerms


@dataclass(frozen=True)
class CaseData:
    id: str
    input: Any


@dataclass(frozen=True)
class ServerTask:
    ref: str  # how to load the task again (a bundled name or a folder path)
    terms: TaskTerms
    digest: str
    seed_dir: Path
    cases: Callable[[str], list[CaseData]]
    verify: Callable[[str, Any], Fraction]  # (case id, parsed answer) -> score in [0, 1]
    root: Path | None = None  # the task's folder (its seed variants are in it)

    @property
    def model(self) -> str:
        return self.terms.models[0] if self.terms.models else ""


def load_server_task(ref: str) -> ServerTask:
    """The task named ``ref`` (bundled name or folder), through holedger.tasks."""
    from holedger import tasks

    loader: Any = getattr(tasks, "load_task", None)
    if loader is None:
        raise NotFoundError(f"cannot load task {ref!r}: holedger.tasks has no load_task")
    loaded = loader(ref)
    return from_loaded(loaded, ref)


def from_loaded(loaded: Any, ref: str) -> ServerTask:
    """Adapt a holedger.tasks LoadedTask."""
    from holedger import tasks

    spec = loaded.spec
    terms = spec.terms() if callable(getattr(spec, "terms", None)) else loaded.terms()
    digest_fn: Any = getattr(tasks, "task_digest", None)
    digest = digest_fn(spec) if digest_fn is not None else loaded.digest
    by_split: dict[str, dict[str, Any]] = {}

    def raw_cases(split: str) -> dict[str, Any]:
        if split not in by_split:
            by_split[split] = {c.id: c for c in loaded.cases(split)}
        return by_split[split]

    def cases(split: str) -> list[CaseData]:
        return [CaseData(c.id, c.input) for c in raw_cases(split).values()]

    def verify(case_id: str, answer: Any) -> Fraction:
        for split in ("dev", "val", "test"):
            case = raw_cases(split).get(case_id)
            if case is not None:
                return Fraction(loaded.verify(case, answer))
        raise NotFoundError(f"no case {case_id} in task {terms.task_id}")

    return ServerTask(
        ref=ref,
        terms=terms,
        digest=str(digest),
        seed_dir=Path(loaded.seed_dir),
        cases=cases,
        verify=verify,
        root=Path(loaded.root) if getattr(loaded, "root", None) is not None else None,
    )
