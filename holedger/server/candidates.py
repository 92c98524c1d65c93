"""Candidate harnesses as git commits in the run's own bare repository (pygit2).

A candidate is a tree of regular files, read and written by the rules of
:mod:`holedger.tasks.harness_tree` (safe paths, no links, size limits, one fixed
signature so the same tree and parent always give the same commit id; its names are
re-exported here). This module adds the other forms a candidate comes in (a file map of
the HTTP API, a tar archive), the checks against the task (the entrypoint's module
present; no immutable path of the task changed, compared with the seed: every file under
it identical, none added, none removed), and the run's repository. Whatever breaks a rule
is refused before anything is written to the repository or the ledger.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pygit2

from holedger.errors import NotFoundError, UsageError
from holedger.tasks.harness_tree import (
    CANDIDATE_MESSAGE as CANDIDATE_MESSAGE,
)
from holedger.tasks.harness_tree import (
    DEFAULT_LIMITS as DEFAULT_LIMITS,
)
from holedger.tasks.harness_tree import (
    EXEC_MODE as EXEC_MODE,
)
from holedger.tasks.harness_tree import (
    MAX_NAME_BYTES as MAX_NAME_BYTES,
)
from holedger.tasks.harness_tree import (
    MAX_PATH_BYTES as MAX_PATH_BYTES,
)
from holedger.tasks.harness_tree import (
    SEED_MESSAGE as SEED_MESSAGE,
)
from holedger.tasks.harness_tree import (
    TREE_MODE as TREE_MODE,
)
from holedger.tasks.harness_tree import (
    CandidateRefused as CandidateRefused,
)
from holedger.tasks.harness_tree import (
    FileEntry as FileEntry,
)
from holedger.tasks.harness_tree import (
    FileMap as FileMap,
)
from holedger.tasks.harness_tree import (
    TreeBudget as TreeBudget,
)
from holedger.tasks.harness_tree import (
    TreeLimits as TreeLimits,
)
from holedger.tasks.harness_tree import (
    clean_path as clean_path,
)
from holedger.tasks.harness_tree import (
    read_directory as read_directory,
)
from holedger.tasks.harness_tree import (
    seed_commit_id as seed_commit_id,
)
from holedger.tasks.harness_tree import (
    signature as signature,
)
from holedger.tasks.harness_tree import (
    write_tree as write_tree,
)


def read_file_map(mapping: Mapping[str, Any], limits: TreeLimits = DEFAULT_LIMITS) -> FileMap:
    """A file map as the HTTP API takes it: path -> text, or {"base64", "executable"}."""
    if not isinstance(mapping, Mapping):
        raise UsageError("files must be an object mapping paths to contents")
    files: FileMap = {}
    budget = TreeBudget(limits)
    for raw_path in sorted(mapping):
        path = clean_path(raw_path)
        value = mapping[raw_path]
        executable = False
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, Mapping) and isinstance(value.get("base64"), str):
            try:
                data = base64.b64decode(value["base64"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise UsageError(f"file {path!r}: bad base64") from exc
            executable = bool(value.get("executable", False))
        else:
            raise UsageError(f"file {path!r}: expected text or {{'base64': ...}}")
        if path in files:
            raise CandidateRefused(f"path {path!r} appears twice")
        budget.add(path, len(data))
        files[path] = FileEntry(data, executable)
    return files


def read_tar(data: bytes, limits: TreeLimits = DEFAULT_LIMITS) -> FileMap:
    """A tar (optionally gzip) archive of the candidate: regular files and folders only."""
    files: FileMap = {}
    budget = TreeBudget(limits)
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UsageError(f"not a tar archive: {exc}") from exc
    members = 0
    with archive:
        try:
            for member in archive:
                members += 1
                if members > limits.max_files * 2:
                    raise CandidateRefused("archive has too many members")
                name = member.name.removeprefix("./")
                if member.isdir():
                    if name.rstrip("/"):
                        clean_path(name.rstrip("/"))
                    continue
                if member.issym() or member.islnk():
                    raise CandidateRefused(
                        f"link {name!r} in candidate archive",
                        hint="candidates may not contain symbolic or hard links",
                    )
                if not member.isfile():
                    raise CandidateRefused(f"{name!r} in candidate archive is not a regular file")
                path = clean_path(name)
                if path.split("/")[-1].endswith(".pyc") or "__pycache__" in path.split("/"):
                    continue
                budget.add(path, member.size)
                handle = archive.extractfile(member)
                if handle is None:
                    raise CandidateRefused(f"cannot read {path!r} from the archive")
                content = handle.read(limits.max_file_bytes + 1)
                if path in files:
                    raise CandidateRefused(f"path {path!r} appears twice in the archive")
                files[path] = FileEntry(content, bool(member.mode & stat.S_IXUSR))
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise UsageError(f"broken tar archive: {exc}") from exc
    return files


# --------------------------------------------------------------------------- checks


def entrypoint_problem(files: Mapping[str, Any], argv: list[str]) -> str | None:
    """Why the entrypoint cannot start from this tree, or None."""
    if "-m" in argv:
        index = argv.index("-m")
        if index + 1 >= len(argv):
            return "entrypoint has '-m' without a module"
        module = argv[index + 1].replace(".", "/")
        if f"{module}/__main__.py" in files or f"{module}.py" in files:
            return None
        return f"entrypoint module {argv[index + 1]!r} is missing ({module}/__main__.py)"
    for arg in argv[1:]:
        if arg.endswith(".py"):
            return None if arg in files else f"entrypoint script {arg!r} is missing"
    return None


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.strip("/")
    return path == prefix or path.startswith(prefix + "/")


def immutable_violations(
    seed: Mapping[str, str], candidate: Mapping[str, str], immutable: list[str]
) -> list[str]:
    """Paths under an immutable prefix that differ from the seed (by blob id and mode)."""
    bad: set[str] = set()
    for prefix in immutable:
        for path in set(seed) | set(candidate):
            if _under(path, prefix) and seed.get(path) != candidate.get(path):
                bad.add(path)
    return sorted(bad)


def changed_paths(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


# --------------------------------------------------------------------------- the repository


@dataclass(frozen=True)
class Commit:
    commit: str
    tree: str
    parent: str | None


class CandidateRepo:
    """One run's bare repository of candidate commits."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if (self.path / "HEAD").exists():
            self.repo = pygit2.Repository(str(self.path))
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.repo = pygit2.init_repository(str(self.path), bare=True)

    def commit(self, files: FileMap, parent: str | None, *, keep: bool = True) -> Commit:
        """Write ``files`` as a tree and commit it (fixed signature).

        With ``keep`` a ref ``refs/candidates/<id>`` keeps the commit; without it the
        objects stay unreferenced until :meth:`keep` (a refused tree is never kept).
        """
        if not files:
            raise CandidateRefused("candidate tree is empty")
        tree = write_tree(self.repo, files)
        parents = [pygit2.Oid(hex=parent)] if parent else []
        message = CANDIDATE_MESSAGE if parent else SEED_MESSAGE
        sig = signature()
        oid = self.repo.create_commit(None, sig, sig, message, tree, parents)
        if keep:
            self.keep(str(oid))
        return Commit(str(oid), str(tree), parent)

    def keep(self, commit: str) -> None:
        """Reference ``commit`` as a recorded candidate."""
        name = f"refs/candidates/{commit}"
        if name not in self.repo.references:
            self.repo.references.create(name, pygit2.Oid(hex=commit), force=True)

    def _commit_obj(self, commit: str) -> pygit2.Commit:
        obj = self._object(commit, "commit")
        assert isinstance(obj, pygit2.Commit)
        return obj

    def _object(self, oid: str, kind: str) -> pygit2.Object:
        """The git object ``oid`` of ``kind`` ("commit" or "tree"); else NotFoundError."""
        try:
            obj = self.repo[oid]
        except (KeyError, ValueError) as exc:
            raise NotFoundError(f"no candidate {kind} {oid} in {self.path.name}") from exc
        if obj.type_str != kind:
            raise NotFoundError(f"{oid} is not a {kind}")
        return obj

    def tree_of(self, commit: str) -> str:
        """The id of ``commit``'s tree."""
        return str(self._commit_obj(commit).tree_id)

    def listing(self, commit: str) -> dict[str, str]:
        """path -> "<mode>:<blob id>" of every file of ``commit``."""
        return self._tree_listing(self._commit_obj(commit).tree)

    def _tree_listing(self, root: pygit2.Tree) -> dict[str, str]:
        out: dict[str, str] = {}

        def walk(tree: pygit2.Tree, prefix: str) -> None:
            for entry in tree:
                path = f"{prefix}{entry.name}"
                if entry.filemode == TREE_MODE:
                    sub = self.repo[entry.id]
                    assert isinstance(sub, pygit2.Tree)
                    walk(sub, path + "/")
                else:
                    out[path] = f"{entry.filemode:o}:{entry.id}"

        walk(root, "")
        return out

    def files(self, commit: str) -> FileMap:
        """Every file of ``commit`` with its content."""
        return self._files(self.listing(commit))

    def _files(self, listing: dict[str, str]) -> FileMap:
        out: FileMap = {}
        for path, ref in listing.items():
            mode, oid = ref.split(":")
            blob = self.repo[oid]
            assert isinstance(blob, pygit2.Blob)
            out[path] = FileEntry(bytes(blob.data), int(mode, 8) == EXEC_MODE)
        return out

    def checkout_tree(self, tree: str, dest: Path) -> Path:
        """Write the files of the tree ``tree`` under ``dest`` (created), read-only."""
        obj = self._object(tree, "tree")
        assert isinstance(obj, pygit2.Tree)
        return self._write_out(self._files(self._tree_listing(obj)), dest)

    @staticmethod
    def _write_out(files: FileMap, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        folders: set[Path] = {dest}
        for path, entry in files.items():
            target = dest / PurePosixPath(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            folders.update(p for p in target.parents if dest in p.parents or p == dest)
            target.write_bytes(entry.data)
            target.chmod(0o555 if entry.executable else 0o444)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            folder.chmod(0o555)
        return dest


def remove_tree(path: Path) -> None:
    """Remove a read-only checkout."""
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)
