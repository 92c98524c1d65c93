"""Candidate trees that travel by their git tree id: what a node writes out is exactly the
tree the server named, or nothing (a changed object, in transit or in the node's cache,
is refused by name)."""

from __future__ import annotations

import stat
from pathlib import Path

import pygit2
import pytest

from holedger.errors import SandboxError
from holedger.executors.trees import TreeCache, object_id, pack_tree


def _repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "run.git"
    repo = pygit2.init_repository(str(path), bare=True)
    inner = repo.TreeBuilder()
    inner.insert("policy.txt", repo.create_blob(b"answers are upper case\n"), 0o100644)
    top = repo.TreeBuilder()
    top.insert("main.py", repo.create_blob(b"print('hi')\n"), 0o100644)
    top.insert("run.sh", repo.create_blob(b"#!/bin/sh\n"), 0o100755)
    top.insert("rules", inner.write(), 0o040000)
    return path, str(top.write())


def test_a_tree_travels_and_is_written_out_read_only(tmp_path: Path) -> None:
    path, tree = _repo(tmp_path)
    objects = pack_tree(path, tree)
    assert len(objects) == 5  # two trees, three blobs
    # the ids are git's: the server's repository names the same objects
    assert {oid for oid, _, _ in objects} == {
        oid for oid, kind, data in objects if object_id(kind, data) == oid
    }
    cache = TreeCache(tmp_path / "node-cache")
    assert not cache.has(tree)
    cache.store(objects)
    assert cache.has(tree)
    out = cache.checkout(tree, tmp_path / "code")
    assert (out / "main.py").read_bytes() == b"print('hi')\n"
    assert (out / "rules" / "policy.txt").read_bytes() == b"answers are upper case\n"
    assert (out / "run.sh").stat().st_mode & stat.S_IXUSR
    assert not (out / "main.py").stat().st_mode & stat.S_IWUSR
    # a second node process opens the same cache and finds the tree
    assert TreeCache(tmp_path / "node-cache").has(tree)


def test_an_object_changed_in_transit_is_refused(tmp_path: Path) -> None:
    path, tree = _repo(tmp_path)
    objects = pack_tree(path, tree)
    oid, kind, data = next(o for o in objects if o[1] == "blob")
    forged = [o if o[0] != oid else (oid, kind, data + b"import os\n") for o in objects]
    cache = TreeCache(tmp_path / "node-cache")
    with pytest.raises(SandboxError, match=f"{oid[:12]} does not match its id"):
        cache.store(forged)
    assert not cache.has(tree)


def test_an_object_changed_in_the_nodes_cache_is_refused_before_use(tmp_path: Path) -> None:
    path, tree = _repo(tmp_path)
    objects = pack_tree(path, tree)
    cache = TreeCache(tmp_path / "node-cache")
    cache.store(objects)
    oid = next(o[0] for o in objects if o[2] == b"print('hi')\n")
    # Replace the cached object with another object's content, kept under the old name.
    other = pygit2.Repository(str(tmp_path / "node-cache"))
    evil = other.odb.write(pygit2.enums.ObjectType.BLOB, b"print('owned')\n")
    loose = tmp_path / "node-cache" / "objects"
    src = loose / str(evil)[:2] / str(evil)[2:]
    dst = loose / oid[:2] / oid[2:]
    dst.chmod(0o644)
    dst.write_bytes(src.read_bytes())
    with pytest.raises(SandboxError, match=oid[:12]):
        TreeCache(tmp_path / "node-cache").checkout(tree, tmp_path / "code")
