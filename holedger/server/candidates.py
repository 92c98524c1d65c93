"""Candidate harnesses as git commits in the run's own bare repository (pygit2).

A candidate is a tree of regular files. Every commit is made with one fixed author and
committer (name, e-mail and timestamp), so the same tree and parent always give the same
commit id: the seed harness's commit id is reproducible from the task's seed folder alone
(:func:`seed_commit_id`) and can be pinned in ``TaskTerms.seed_commit``.

What is refused, before anything is written to the repository or the ledger:

* a path that is absolute, has a ``..``, ``.`` or empty component, a backslash or a NUL,
  or names a ``.git`` entry;
* **any** symbolic link (and any hard link, device or FIFO in an archive): a harness never
  needs one, and refusing them all is simpler to audit than deciding where each points;
* a tree over the size limits (:class:`TreeLimits`: file count, bytes per file, total
  bytes, path depth);
* a tree without the entrypoint's module (``python3 -m harness`` needs
  ``harness/__main__.py`` or ``harness.py``);
* a tree that changes an immutable path of the task (compared with the seed: every file
  under it must be identical, none added, none removed).

Reading a directory skips ``__pycache__`` folders and ``*.pyc`` files (they are build
products, not the candidate).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pygit2

from holedger.errors import NotFoundError, PolicyError, UsageError
from holedger.schemas.untrusted import escape_text, is_safe

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


class _Budget:
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
    budget = _Budget(limits)

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


def read_file_map(mapping: Mapping[str, Any], limits: TreeLimits = DEFAULT_LIMITS) -> FileMap:
    """A file map as the HTTP API takes it: path -> text, or {"base64", "executable"}."""
    if not isinstance(mapping, Mapping):
        raise UsageError("files must be an object mapping paths to contents")
    files: FileMap = {}
    budget = _Budget(limits)
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
    budget = _Budget(limits)
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


def _write_tree(repo: pygit2.Repository, files: FileMap) -> pygit2.Oid:
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
        tree = _write_tree(self.repo, files)
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


def seed_commit_id(seed_dir: Path, limits: TreeLimits = DEFAULT_LIMITS) -> str:
    """The commit id the seed folder gets as commit 0 of every run (no repository needed)."""
    with tempfile.TemporaryDirectory(prefix="holedger-seed-") as tmp:
        repo = CandidateRepo(Path(tmp) / "seed.git")
        return repo.commit(read_directory(seed_dir, limits), None).commit
