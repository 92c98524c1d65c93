"""Task and manifest digests (docs/FORMAT.md, "Task and manifest digests").

Every digest is the lower-case hex SHA-256 of canonical JSON
(:func:`holedger.schemas.canonical.canonical_json`), except the verifier's, which is the
SHA-256 of its source file's bytes:

* case digest: the case record, ``{"id", "input", "expected"}`` for a bundled case (an
  imported case's record is ``{"id", "source"}``);
* split digest: the list of ``[case id, case digest]`` pairs sorted by case id;
* manifest digest: the object ``{"dev": d, "val": v, "test": t}`` of the three split
  digests;
* seed tree digest: the list of ``[path, file SHA-256, executable]`` sorted by path, for
  every regular file under the seed folder (``__pycache__`` folders and ``*.pyc`` files
  skipped, as the server skips them);
* task digest: the whole task spec as JSON (it holds all of the above and the
  environment).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from holedger.errors import VerificationError
from holedger.schemas.canonical import canonical_json
from holedger.schemas.task import SPLITS, TaskSpec
from holedger.schemas.types import Split

SKIPPED_DIRS = frozenset({"__pycache__", ".git"})


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_digest(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def case_digest(record: Mapping[str, Any]) -> str:
    """The digest of one case record (an object with at least ``id``)."""
    return json_digest(dict(record))


def split_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """The digest of one split: its sorted ``[case id, case digest]`` pairs."""
    return json_digest(sorted([case_id, digest] for case_id, digest in pairs))


def manifest_digest(split_digests: Mapping[Split, str]) -> str:
    """The digest of a manifest: the object of its three split digests."""
    if set(split_digests) != set(SPLITS):
        raise VerificationError("a manifest digest needs exactly the splits dev, val, test")
    return json_digest({split: split_digests[split] for split in SPLITS})


def tree_files(root: Path) -> list[tuple[str, str, bool]]:
    """``(path, sha256, executable)`` of every regular file under ``root``, sorted by path."""
    if root.is_symlink() or not root.is_dir():
        raise VerificationError(f"seed folder {root.name} is missing or not a directory")
    found: list[tuple[str, str, bool]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if not stat.S_ISREG(info.st_mode):
                raise VerificationError(f"seed file {rel} is not a regular file")
            executable = bool(info.st_mode & stat.S_IXUSR)
            found.append((rel, sha256_hex(path.read_bytes()), executable))
    return sorted(found)


def tree_digest(root: Path) -> str:
    """The seed tree digest of the folder ``root``."""
    return json_digest([[rel, digest, executable] for rel, digest, executable in tree_files(root)])


def task_digest(spec: TaskSpec) -> str:
    """SHA-256 of the canonical JSON of the whole task spec."""
    return json_digest(spec.model_dump(mode="json"))
