"""What an optimizer reads of its run's candidates, and commits as changes on a parent.

* :func:`tree_view`: a committed candidate's files (the seed's too): path, size, whether
  executable, and whether under an immutable path of the task; with ``contents``, each
  file's text (or its bytes in base64 when they are not UTF-8).
* :func:`file_bytes`: one file of a committed candidate.
* :func:`apply_changes`: a parent's tree with changes on top: path -> new content, or
  ``null`` to remove the file. The result is committed as any whole tree is.
* :func:`immutable_refusal`: the one-line refusal of a tree that breaks an immutable
  path, saying which rule and what happened (a file removed, added, or changed).

An optimizer reads only candidates committed in its own run; the test split and the
verifier are never in a candidate tree.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from holedger.errors import NotFoundError, UsageError
from holedger.server.candidates import (
    CandidateRefused,
    CandidateRepo,
    FileEntry,
    FileMap,
    TreeLimits,
    clean_path,
)
from holedger.server.state import RunState


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def immutable_rule(path: str, immutable: list[str]) -> str | None:
    """The immutable path of the task that ``path`` is under, if any."""
    return next((p for p in immutable if _under(path, p)), None)


def resolve(state: RunState, ref: str) -> str:
    commit = state.resolve_candidate(ref)
    if commit is None:
        raise NotFoundError(
            f"no committed candidate {ref!r} in run {state.run_id}",
            hint="'seed', or a candidate id (or a unique prefix of 4+ characters)",
        )
    return commit


def tree_view(
    repo: CandidateRepo,
    state: RunState,
    ref: str,
    immutable: list[str],
    *,
    contents: bool = False,
) -> dict[str, Any]:
    """A committed candidate's files, sorted by path (see the module's doc)."""
    commit = resolve(state, ref)
    info = state.candidates[commit]
    files = []
    for path, entry in sorted(repo.files(commit).items()):
        item: dict[str, Any] = {
            "path": path,
            "size": len(entry.data),
            "executable": entry.executable,
            "immutable": immutable_rule(path, immutable) is not None,
        }
        if contents:
            try:
                item["text"] = entry.data.decode("utf-8")
            except UnicodeDecodeError:
                item["base64"] = base64.b64encode(entry.data).decode("ascii")
        files.append(item)
    return {
        "candidate": commit,
        "index": info.index,
        "tree": info.tree,
        "parent": info.parent,
        "immutable_paths": immutable,
        "files": files,
    }


def file_bytes(repo: CandidateRepo, state: RunState, ref: str, path: str) -> bytes:
    commit = resolve(state, ref)
    try:
        wanted = clean_path(path)
    except (UsageError, CandidateRefused) as exc:
        raise UsageError(f"bad file path {path!r}: {exc}") from exc
    entry = repo.files(commit).get(wanted)
    if entry is None:
        raise NotFoundError(f"candidate {commit[:12]} has no file {wanted!r}")
    return entry.data


def apply_changes(base: FileMap, changes: Mapping[str, Any], limits: TreeLimits) -> FileMap:
    """``base`` with ``changes`` applied: path -> text, ``{"base64", "executable"}``, or
    None (remove the file). Removing a file that is not there is an error (a typo would
    otherwise pass unnoticed); the result is held to the tree limits."""
    if not isinstance(changes, Mapping):
        raise UsageError("changes must be an object mapping paths to contents or null")
    files = dict(base)
    for raw_path in sorted(changes):
        path = clean_path(raw_path)
        value = changes[raw_path]
        if value is None:
            if path not in files:
                raise UsageError(
                    f"changes remove {path!r}, which the parent does not have",
                    hint="list the parent's files: GET .../candidates/PARENT/tree",
                )
            del files[path]
        elif isinstance(value, str):
            old = files.get(path)
            files[path] = FileEntry(value.encode("utf-8"), old.executable if old else False)
        elif isinstance(value, Mapping) and isinstance(value.get("base64"), str):
            try:
                data = base64.b64decode(value["base64"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise UsageError(f"change to {path!r}: bad base64") from exc
            files[path] = FileEntry(data, bool(value.get("executable", False)))
        else:
            raise UsageError(f"change to {path!r}: expected text, {{'base64': ...}} or null")
    count, total = 0, 0
    for path, entry in files.items():
        count += 1
        total += len(entry.data)
        if len(entry.data) > limits.max_file_bytes:
            raise CandidateRefused(
                f"file {path!r} is {len(entry.data)} bytes, over the "
                f"{limits.max_file_bytes} byte limit"
            )
    if count > limits.max_files:
        raise CandidateRefused(f"candidate tree has more than {limits.max_files} files")
    if total > limits.max_total_bytes:
        raise CandidateRefused(f"candidate tree is over the {limits.max_total_bytes} byte limit")
    return files


def immutable_refusal(
    seed: Mapping[str, str], candidate: Mapping[str, str], immutable: list[str]
) -> CandidateRefused | None:
    """The refusal of a tree whose files under an immutable path are not the seed's, or
    None. It names the rule (the immutable path), and what happened to the first files:
    removed (the usual cause: a whole-tree commit that left them out), added, or changed
    (content or mode)."""
    removed, added, changed = [], [], []
    for path in sorted(set(seed) | set(candidate)):
        if immutable_rule(path, immutable) is None or seed.get(path) == candidate.get(path):
            continue
        if path not in candidate:
            removed.append(path)
        elif path not in seed:
            added.append(path)
        else:
            changed.append(path)
    if not (removed or added or changed):
        return None
    first = (removed or added or changed)[0]
    rule = immutable_rule(first, immutable)
    parts = []
    for verb, paths in (("removes", removed), ("adds", added), ("changes", changed)):
        if paths:
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            parts.append(f"{verb} {shown}")
    message = (
        f"candidate {'; '.join(parts)} under the immutable path {rule!r}: every file under "
        "an immutable path must be the seed's (same content and mode), none added or removed"
    )
    if removed:
        hint = (
            'a commit\'s "files" is the whole tree, so a file left out is removed: send the '
            'seed\'s files under the immutable paths too, or commit "changes" on top of the '
            "parent instead"
        )
    else:
        hint = "restore the task's immutable files as in the seed"
    return CandidateRefused(message, hint=hint)


def changes_on_parent(
    service: Any, run_id: str, parent: str, changes: Mapping[str, Any]
) -> FileMap:
    """The tree of ``parent`` (a committed candidate of the run) with ``changes`` on top."""
    state = service.states.current(run_id)
    commit = resolve(state, parent)
    return apply_changes(service.repo(run_id).files(commit), changes, service.tree_limits)
