"""Prepared candidate edits: small, reviewable changes to a task's seed harness.

A task folder may hold ``edits/NN-name/edit.toml``; each file has a one-line
``description``, the ``lever`` it touches (one of the eight harness levers) and one or
more ``[[replace]]`` blocks ``{path, old, new}``. Applying an edit replaces, in the
candidate tree, the one occurrence of ``old`` in ``path`` by ``new``; an ``old`` that is
absent or not unique refuses the whole edit, before anything is written. Edits touch
disjoint parts of the seed harness, so any subset applies in any order. An edit folder
may also hold ``files/``: whole files copied into the tree at the same relative path.
"""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from holedger.errors import NotFoundError, UsageError

LEVERS = (
    "prompt",
    "context_management",
    "step_cap",
    "retry_timeout",
    "tool_schema",
    "answer_extraction",
    "retrieval",
    "reasoning_effort",
)


class EditConflictError(UsageError):
    """A prepared edit does not apply to the candidate tree as it is."""


@dataclass(frozen=True)
class Replacement:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class CandidateEdit:
    """One prepared edit of a task's harness."""

    name: str
    description: str
    lever: str
    replacements: tuple[Replacement, ...]
    files_dir: Path | None
    # A shortcut that overfits (``overfitting = true``), kept for audits to find: left
    # out of load_edits unless asked for.
    overfitting: bool = False

    def apply(self, tree: Path) -> list[str]:
        """Apply to the candidate tree at ``tree``; returns the changed paths, sorted."""
        return apply_edit(self, tree)


def _safe_relative(path: str, edit: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UsageError(f"edit {edit}: path {path!r} leaves the candidate tree")
    return rel


def load_edit(folder: Path) -> CandidateEdit:
    """Read one ``edits/NN-name/`` folder."""
    spec_path = folder / "edit.toml"
    if not spec_path.is_file():
        raise NotFoundError(f"edit {folder.name} has no edit.toml")
    try:
        spec = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"edit {folder.name}: edit.toml is not valid TOML: {exc}") from exc
    description = spec.get("description")
    lever = spec.get("lever")
    if not isinstance(description, str) or "\n" in description or not description:
        raise UsageError(f"edit {folder.name}: 'description' must be one line")
    if lever not in LEVERS:
        raise UsageError(f"edit {folder.name}: unknown lever {lever!r}", hint=", ".join(LEVERS))
    replacements = []
    for block in spec.get("replace", []):
        if not all(isinstance(block.get(k), str) for k in ("path", "old", "new")):
            raise UsageError(f"edit {folder.name}: each [[replace]] needs path, old and new")
        _safe_relative(block["path"], folder.name)
        replacements.append(Replacement(block["path"], block["old"], block["new"]))
    files_dir = folder / "files"
    return CandidateEdit(
        folder.name,
        description,
        str(lever),
        tuple(replacements),
        files_dir if files_dir.is_dir() else None,
        spec.get("overfitting") is True,
    )


def load_edits(task_root: Path, shortcuts: bool = False) -> list[CandidateEdit]:
    """Every prepared edit of the task at ``task_root``, in folder-name order; an edit
    marked ``overfitting = true`` only with ``shortcuts``."""
    edits_dir = task_root / "edits"
    if not edits_dir.is_dir():
        return []
    edits = [load_edit(p) for p in sorted(edits_dir.iterdir()) if p.is_dir()]
    return [e for e in edits if shortcuts or not e.overfitting]


def apply_edit(edit: CandidateEdit, tree: Path) -> list[str]:
    """Apply ``edit`` to ``tree``; all replacements are checked before any file is written."""
    pending: dict[str, str] = {}
    for repl in edit.replacements:
        target = tree / _safe_relative(repl.path, edit.name)
        if repl.path not in pending:
            if not target.is_file():
                raise EditConflictError(f"edit {edit.name}: {repl.path} is not in the tree")
            pending[repl.path] = target.read_text(encoding="utf-8")
        count = pending[repl.path].count(repl.old)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times"
            raise EditConflictError(
                f"edit {edit.name}: the text to replace in {repl.path} is {where}",
                hint="the tree has diverged from what this edit expects",
            )
        pending[repl.path] = pending[repl.path].replace(repl.old, repl.new)
    changed = set(pending)
    for path, text in pending.items():
        (tree / path).write_text(text, encoding="utf-8")
    if edit.files_dir is not None:
        for source in sorted(edit.files_dir.rglob("*")):
            if source.is_file():
                rel = source.relative_to(edit.files_dir).as_posix()
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, tree / rel)
                changed.add(rel)
    return sorted(changed)
