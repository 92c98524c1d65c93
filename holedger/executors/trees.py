"""Candidate trees that travel to other machines by their git tree id.

The server packs a tree as the raw git objects it is made of (the tree objects and the
blobs they name). A node keeps a cache: a bare git object store of its own. Before a
trial uses a tree, the node checks every object it reads against its id (the SHA-1 of
git's object header and content), whether the object just arrived or was cached earlier,
so a tree that reaches the sandbox is exactly the tree the server named, or the trial
does not run.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path, PurePosixPath

import pygit2

from holedger.errors import SandboxError

# (object id, type name, raw content); type names as git's headers write them.
GitObject = tuple[str, str, bytes]
_TYPES = {pygit2.enums.ObjectType.TREE: "tree", pygit2.enums.ObjectType.BLOB: "blob"}
_TYPE_IDS = {name: kind for kind, name in _TYPES.items()}
EXEC_MODE = 0o100755
TREE_MODE = 0o040000


def object_id(kind: str, data: bytes) -> str:
    """The git id of an object of ``kind`` holding ``data``."""
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


def pack_tree(repository: Path, tree: str) -> list[GitObject]:
    """Every object of ``tree`` in the git repository at ``repository``, each once."""
    repo = pygit2.Repository(str(repository))
    out: list[GitObject] = []
    seen: set[str] = set()
    stack = [tree]
    while stack:
        oid = stack.pop()
        if oid in seen:
            continue
        seen.add(oid)
        kind, data = repo.odb.read(oid)
        out.append((oid, _TYPES[kind], bytes(data)))
        if kind == pygit2.enums.ObjectType.TREE:
            obj = repo[oid]
            assert isinstance(obj, pygit2.Tree)
            stack.extend(str(entry.id) for entry in obj)
    return out


class TreeCache:
    """A node's cache of candidate trees: a bare object store under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        with self._lock:
            if (root / "HEAD").exists():
                self.repo = pygit2.Repository(str(root))
            else:
                root.mkdir(parents=True, exist_ok=True)
                self.repo = pygit2.init_repository(str(root), bare=True)

    def has(self, tree: str) -> bool:
        with self._lock:
            return tree in self.repo.odb

    def store(self, objects: list[GitObject]) -> None:
        """Add objects, each checked against its id first (a mismatch stores nothing)."""
        for oid, kind, data in objects:
            if kind not in _TYPE_IDS or object_id(kind, data) != oid:
                raise SandboxError(f"candidate object {oid[:12]} does not match its id")
        with self._lock:
            for _oid, kind, data in objects:
                self.repo.odb.write(_TYPE_IDS[kind], data)

    def checkout(self, tree: str, dest: Path) -> Path:
        """Write ``tree``'s files under ``dest`` (created), read-only, checking every
        object read against its id."""
        dest.mkdir(parents=True)
        folders = [dest]
        with self._lock:
            self._write(tree, dest, folders)
        for folder in reversed(folders):
            folder.chmod(0o555)
        return dest

    def _read(self, oid: str, kind: str) -> bytes:
        try:
            found, data = self.repo.odb.read(oid)
        except KeyError:
            raise SandboxError(f"candidate object {oid[:12]} is not in the node's cache") from None
        except pygit2.GitError:  # libgit2 re-hashes too: the stored object is not its id
            raise SandboxError(
                f"candidate object {oid[:12]} in the node's cache is damaged"
            ) from None
        if _TYPES.get(found) != kind or object_id(kind, bytes(data)) != oid:
            raise SandboxError(f"candidate object {oid[:12]} in the node's cache is damaged")
        return bytes(data)

    def _write(self, tree: str, folder: Path, folders: list[Path]) -> None:
        self._read(tree, "tree")
        obj = self.repo[tree]
        assert isinstance(obj, pygit2.Tree)
        for entry in obj:
            name = entry.name or ""
            if name in ("", ".", "..") or "/" in name or len(PurePosixPath(name).parts) != 1:
                raise SandboxError(f"candidate tree {tree[:12]} holds a bad name {name!r}")
            target = folder / name
            if entry.filemode == TREE_MODE:
                target.mkdir()
                folders.append(target)
                self._write(str(entry.id), target, folders)
            elif entry.filemode in (0o100644, EXEC_MODE):
                target.write_bytes(self._read(str(entry.id), "blob"))
                os.chmod(target, 0o555 if entry.filemode == EXEC_MODE else 0o444)
            else:
                raise SandboxError(f"candidate tree {tree[:12]} holds a link or submodule")
