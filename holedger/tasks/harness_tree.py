"""A harness as a tree of files, and the git commit id it gets: the rules for reading one.

A harness (the seed of a task, or a candidate) is a tree of regular files. Every commit
of one is made with one fixed author and committer (name, e-mail and timestamp), so the
same tree and parent always give the same commit id: the seed harness's commit id is
reproducible from the task's seed folder alone (:func:`seed_commit_id`) and is pinned in
``TaskTerms.seed_commit``. The server commits candidates with the same tree writer and
signature (:mod:`holedger.server.candidates`).

Refused while a tree is read: a path that is absolute, has a ``..``, ``.`` or empty
component, a backslash or a NUL, names a ``.git`` entry or holds a control character;
any symbolic link or special file; a tree over the size limits (:class:`TreeLimits`).
Reading a directory skips ``__pycache__`` folders and ``*.pyc`` files.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2

from holedger.errors import PolicyError, UsageError
from holedger.untrusted import escape_text, is_safe

COMMIT_NAME = "holedger"
COMMIT_EMAIL = "candidates@holedger.invalid"
SEED_MESSAGE = "seed\n"
CANDIDATE_MESSAGE = "candidate\n"
SKIPPED_DIRS = frozenset({"__pycache__"})
FILE_MODE = pygit2.GIT_FILEMODE_BLOB
EXEC_MODE = pygit2.GIT_FILEMODE_BLOB_EXECUTABLE
TREE_MODE = pygit2.GIT_FILEMODE_TREE


class CandidateRefused(PolicyError):
    """A candidate tree breaks a rule; nothing was committed or recorded."""


@dataclass(frozen=True)
class TreeLimits:
    """Size limits of one candidate tree."""

    max_files: int = 2000
    max_file_bytes: int = 4 << 20
    max_total_bytes: int = 32 << 20
    max_depth: int = 32


DEFAULT_LIMITS = TreeLimits()
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024


@dataclass(frozen=True)
class FileEntry:
    data: bytes
    executable: bool = False


FileMap = dict[str, FileEntry]


def signature() -> pygit2.Signature:
    """The fixed author and committer of every candidate commit (time 0, UTC)."""
    return pygit2.Signature(COMMIT_NAME, COMMIT_EMAIL, 0, 0)


# --------------------------------------------------------------------------- paths


def clean_path(path: str) -> str:
    """``path`` as a safe relative POSIX path, or CandidateRefused naming the problem.

    It must be UTF-8 text (the tree is recorded as JSON text in CandidateCommitted), each
    name at most MAX_NAME_BYTES and the whole at most MAX_PATH_BYTES (as on common file
    systems; the recorded list of changed paths stays small).
    """
    if not isinstance(path, str) or not path:
        raise CandidateRefused("empty path in candidate tree")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        try:  # name it by its bytes, as a folder read it (b'bad\xff.py')
            shown = repr(os.fsencode(path[:200]))
        except UnicodeEncodeError:  # a lone surrogate, as JSON can spell one
            shown = repr(path[:200])
        raise CandidateRefused(
            f"path {shown} is not UTF-8 text",
            hint="rename the file: every path in a candidate tree must be valid UTF-8",
        ) from None
    if size > MAX_PATH_BYTES:
        raise CandidateRefused(
            f"path {path[:80]!r}... is {size} bytes, over the {MAX_PATH_BYTES} byte limit"
        )
    for name in path.split("/"):
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise CandidateRefused(
                f"name {name[:80]!r}... in the candidate tree is over {MAX_NAME_BYTES} bytes"
            )
    if "\x00" in path or "\\" in path:
        raise CandidateRefused(f"path {path!r} holds a NUL or a backslash")
    if not is_safe(path):
        # A name that would steer a terminal or hide text (escape sequences, bidi
        # overrides) where the path is shown: refused, never stored. repr() escapes it.
        raise CandidateRefused(
            f"path {escape_text(path)!r} holds a control or format character",
            hint="rename the file: no control characters, bidi overrides or zero-width "
            "characters in candidate paths",
        )
    if path.startswith("/"):
        raise CandidateRefused(f"absolute path {path!r} in candidate tree")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise CandidateRefused(
                f"path {path!r} escapes or is not normal (component {part!r})",
                hint="use relative paths without '.', '..' or '//'",
            )
        if part.lower() == ".git":
            raise CandidateRefused(f"path {path!r} names a .git entry")
    return "/".join(parts)


class TreeBudget:
    """Counts files and bytes against the limits while a tree is read."""

    def __init__(self, limits: TreeLimits) -> None:
        self.limits = limits
        self.files = 0
        self.total = 0

    def add(self, path: str, size: int) -> None:
        limits = self.limits
        if path.count("/") + 1 > limits.max_depth:
            raise CandidateRefused(f"path {path!r} is deeper than {limits.max_depth} levels")
        self.files += 1
        if self.files > limits.max_files:
            raise CandidateRefused(f"candidate tree has more than {limits.max_files} files")
        if size > limits.max_file_bytes:
            raise CandidateRefused(
                f"file {path!r} is {size} bytes, over the {limits.max_file_bytes} byte limit"
            )
        self.total += size
        if self.total > limits.max_total_bytes:
            raise CandidateRefused(
                f"candidate tree is over the {limits.max_total_bytes} byte limit"
            )


# --------------------------------------------------------------------------- readers


def read_directory(root: Path, limits: TreeLimits = DEFAULT_LIMITS) -> FileMap:
    """Every regular file under ``root``; refuses symlinks and special files."""
    root = Path(root)
    if root.is_symlink() or not root.is_dir():
        raise UsageError(f"{root} is not a directory", hint="give the candidate's folder")
    files: FileMap = {}
    budget = TreeBudget(limits)

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{prefix}{entry.name}"
                if entry.is_symlink():
                    raise CandidateRefused(
                        f"symbolic link {rel!r} in candidate tree",
                        hint="candidates may not contain symbolic links; copy the file",
                    )
                if entry.is_dir(follow_symlinks=False):
                    if entry.name in SKIPPED_DIRS:
                        continue
                    if entry.name == ".git":
                        continue
                    walk(Path(entry.path), f"{clean_path(rel)}/")
                    continue
                if not entry.is_file(follow_symlinks=False):
                    raise CandidateRefused(f"{rel!r} is not a regular file")
                if entry.name.endswith(".pyc"):
                    continue
                rel = clean_path(rel)
                info = entry.stat(follow_symlinks=False)
                budget.add(rel, info.st_size)
                data = Path(entry.path).read_bytes()
                if len(data) != info.st_size:
                    raise CandidateRefused(f"file {rel!r} changed while it was read")
                files[rel] = FileEntry(data, bool(info.st_mode & stat.S_IXUSR))

    walk(root, "")
    return files


# --------------------------------------------------------------------------- git form


def write_tree(repo: pygit2.Repository, files: FileMap) -> pygit2.Oid:
    """Write ``files`` into ``repo`` as git trees and blobs; the root tree's id."""
    nested: dict[str, Any] = {}
    for path, entry in files.items():
        # Every path, however the tree came (folder, archive, JSON, a caller's map).
        if clean_path(path) != path:
            raise CandidateRefused(f"path {path!r} is not in normal form")
        node = nested
        parts = path.split("/")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CandidateRefused(f"{path!r} is under a file of the same name")
            node = child
        if parts[-1] in node:
            raise CandidateRefused(f"{path!r} is both a file and a folder")
        node[parts[-1]] = entry

    def build(node: dict[str, Any]) -> pygit2.Oid:
        builder = repo.TreeBuilder()
        for name in sorted(node):
            value = node[name]
            if isinstance(value, dict):
                builder.insert(name, build(value), TREE_MODE)
            else:
                mode = EXEC_MODE if value.executable else FILE_MODE
                builder.insert(name, repo.create_blob(value.data), mode)
        oid: pygit2.Oid = builder.write()
        return oid

    return build(nested)


def seed_commit_id(seed_dir: Path, limits: TreeLimits = DEFAULT_LIMITS) -> str:
    """The commit id the seed folder gets as commit 0 of every run (no repository needed)."""
    files = read_directory(seed_dir, limits)
    if not files:
        raise CandidateRefused("candidate tree is empty")
    with tempfile.TemporaryDirectory(prefix="holedger-seed-") as tmp:
        repo = pygit2.init_repository(str(Path(tmp) / "seed.git"), bare=True)
        sig = signature()
        tree = write_tree(repo, files)
        return str(repo.create_commit(None, sig, sig, SEED_MESSAGE, tree, []))
