"""Reading a candidate's files for the lever analysis: from a run bundle's git objects
(parsed here, never written anywhere) or from the home's candidate repository."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

Reader = Callable[[str, str], "str | None"]  # (commit, path) -> text


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def bundle_reader(bundle: Any) -> Reader:
    """Files of a candidate from an open RunBundle's git objects."""

    def obj(oid: str, kind: int) -> bytes | None:
        got = bundle.git_object(oid)
        return got[1] if got is not None and got[0] == kind else None

    def read(commit: str, path: str) -> str | None:
        body = obj(commit, 1)
        if body is None or not body.startswith(b"tree "):
            return None
        oid = body[5:45].decode("ascii", "replace")
        for part in path.split("/"):
            tree = obj(oid, 2)
            if tree is None:
                return None
            found = None
            pos = 0
            while pos < len(tree):
                nul = tree.index(b"\0", pos)
                _, _, name = tree[pos:nul].partition(b" ")
                entry = tree[nul + 1 : nul + 21].hex()
                pos = nul + 21
                if name.decode("utf-8", "replace") == part:
                    found = entry
                    break
            if found is None:
                return None
            oid = found
        blob = obj(oid, 3)
        return None if blob is None else _text(blob)

    return read


def repo_reader(repo_path: Path) -> Reader | None:
    """Files of a candidate from a bare candidate repository (None when it is absent)."""
    if not repo_path.is_dir():
        return None
    import pygit2

    repo = pygit2.Repository(str(repo_path))

    def read(commit: str, path: str) -> str | None:
        try:
            entry = repo[commit].peel(pygit2.Tree)[path]
            blob = repo[entry.id]
        except (KeyError, ValueError, TypeError):
            return None
        data = getattr(blob, "data", None)
        return None if data is None else _text(data)

    return read
