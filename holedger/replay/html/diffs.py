"""Each candidate's diff against its parent, read from the run's candidate repository, with
the name of the task's prepared edit it is, where it is one.

A task may ship prepared edits (``edits/NN-name/edit.toml``: ``description``, ``lever``,
``[[replace]]`` blocks of ``path``, ``old``, ``new``, and whole files under ``files/``),
as the bundled task does for its example optimizer. A candidate *is* a prepared edit when
applying that edit to its parent's tree gives exactly its tree. The repository and the
edits are optional: without them the page lists the changed paths the events record.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_LINES = 400  # diff lines shown per candidate; the rest are counted


@dataclass(frozen=True)
class PreparedEdit:
    name: str
    lever: str
    description: str
    replacements: tuple[tuple[str, str, str], ...]
    files: tuple[tuple[str, str], ...]

    def apply(self, tree: dict[str, str]) -> dict[str, str] | None:
        out = dict(tree)
        for path, old, new in self.replacements:
            text = out.get(path)
            if text is None or text.count(old) != 1:
                return None
            out[path] = text.replace(old, new)
        out.update(self.files)
        return out


@dataclass(frozen=True)
class CandidateDiff:
    """What changed from the parent: unified diff lines (``+``, ``-``, `` `` context,
    ``@`` hunk headers, ``=`` file names), counts, and the prepared edit it is."""

    lines: tuple[tuple[str, str], ...] = ()
    added: int = 0
    removed: int = 0
    files: int = 0
    hidden: int = 0
    edit: PreparedEdit | None = None


@dataclass
class _Diff:
    """A diff while it is read."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    added: int = 0
    removed: int = 0
    files: int = 0
    hidden: int = 0


def load_edits(folder: Path | None) -> list[PreparedEdit]:
    """The prepared edits of a task's ``edits/`` folder (none when there is no folder; an
    edit whose file cannot be read is left out)."""
    if folder is None or not folder.is_dir():
        return []
    edits = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        try:
            spec = tomllib.loads((sub / "edit.toml").read_text(encoding="utf-8"))
            repl = tuple((b["path"], b["old"], b["new"]) for b in spec.get("replace", []))
            files_dir = sub / "files"
            files = tuple(
                (f.relative_to(files_dir).as_posix(), f.read_text(encoding="utf-8"))
                for f in sorted(files_dir.rglob("*"))
                if files_dir.is_dir() and f.is_file()
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        edits.append(
            PreparedEdit(
                sub.name, str(spec.get("lever", "")), str(spec.get("description", "")), repl, files
            )
        )
    return edits


def candidate_diffs(
    repo_path: Path | None, pairs: list[tuple[str, str | None]], edits: list[PreparedEdit]
) -> dict[str, CandidateDiff]:
    """The diff of each (commit, parent) against its parent (the seed, with no parent, has
    none); empty when the repository cannot be read."""
    if repo_path is None or not repo_path.exists():
        return {}
    try:
        import pygit2

        repo = pygit2.Repository(str(repo_path))
    except Exception:  # pygit2 raises several types for a path that is no repository
        return {}
    out: dict[str, CandidateDiff] = {}
    for commit_id, parent_id in pairs:
        try:
            commit = repo.get(commit_id)
            parent = repo.get(parent_id) if parent_id else None
            if commit is None or parent is None:
                continue
            out[commit_id] = _diff(repo, commit, parent, edits)
        except (KeyError, ValueError, pygit2.GitError):
            continue
    return out


def _diff(repo: Any, commit: Any, parent: Any, edits: list[PreparedEdit]) -> CandidateDiff:
    result = _Diff()
    diff = repo.diff(parent.tree, commit.tree)
    for patch in diff:
        result.files += 1
        path = patch.delta.new_file.path or patch.delta.old_file.path
        _add(result, "=", path)
        if patch.delta.is_binary:
            _add(result, " ", "(binary file)")
            continue
        for hunk in patch.hunks:
            _add(result, "@", hunk.header.rstrip("\n"))
            for line in hunk.lines:
                origin = line.origin if line.origin in "+- " else " "
                if origin == "+":
                    result.added += 1
                elif origin == "-":
                    result.removed += 1
                _add(result, origin, line.content.rstrip("\n"))
    edit = None
    if edits:
        before, after = _tree_text(repo, parent.tree), _tree_text(repo, commit.tree)
        edit = next((e for e in edits if e.apply(before) == after), None)
    return CandidateDiff(
        tuple(result.lines), result.added, result.removed, result.files, result.hidden, edit
    )


def _add(result: _Diff, kind: str, text: str) -> None:
    if len(result.lines) < MAX_LINES:
        result.lines.append((kind, text))
    else:
        result.hidden += 1


def _tree_text(repo: Any, tree: Any, prefix: str = "") -> dict[str, str]:
    """Every text file of a git tree, by path."""
    out: dict[str, str] = {}
    for entry in tree:
        path = prefix + entry.name
        obj = repo.get(entry.id)
        if entry.type_str == "tree":
            out.update(_tree_text(repo, obj, path + "/"))
        elif entry.type_str == "blob":
            try:
                out[path] = obj.data.decode("utf-8")
            except UnicodeDecodeError:
                out[path] = f"<binary {entry.id}>"
    return out
