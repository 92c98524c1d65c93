"""Importing a VeRO partitions folder as a holedger split manifest.

A VeRO folder (as published for the HarnessOpt-Bench tasks) holds ``development.json``,
``validation.json`` and ``test.json`` (lists of case names) and ``manifest.json``, whose
``tasks`` come in three shapes: objects with ``name`` and ``partition`` (and a
``partition_digest`` over the three lists), objects with ``name``, ``source_id`` and
``partition`` (no digest), or a plain list of names. Every shape has
``partition_counts``.

The import refuses, naming the problem, when a split file repeats a case, when two
split files share a case, when the manifest places a case in another partition than the
file that lists it, when the manifest and the files do not hold the same cases, when a
count disagrees with ``partition_counts``, or when ``partition_digest`` does not match.

Imported case records are ``{"id": name, "source": entry}``, where ``entry`` is the
manifest's object for the case without its ``partition`` (``{"name": name}`` for the
plain-list shape); digests are then as for any manifest (docs/FORMAT.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from holedger.errors import CanonicalError, NotFoundError, VerificationError
from holedger.schemas.task import SPLITS, ManifestCase, SplitManifest
from holedger.schemas.types import Split
from holedger.tasks import digests

VERO_SPLITS: dict[str, Split] = {"development": "dev", "validation": "val", "test": "test"}


class VeroImportError(VerificationError):
    """A VeRO partitions folder is inconsistent; the message names the problem."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise NotFoundError(
            f"{path.parent.name}/{path.name} is missing",
            hint="a VeRO partitions folder holds development.json, validation.json, "
            "test.json and manifest.json",
        ) from exc
    except (OSError, ValueError) as exc:
        raise VeroImportError(f"{path.parent.name}/{path.name} is not valid JSON") from exc


def _split_lists(folder: Path) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for vero_name in VERO_SPLITS:
        names = _read_json(folder / f"{vero_name}.json")
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise VeroImportError(f"{vero_name}.json must be a list of case names")
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise VeroImportError(f"case {name} is listed twice in {vero_name}.json")
            seen.add(name)
        lists[vero_name] = names
    owner: dict[str, str] = {}
    for vero_name, names in lists.items():
        for name in names:
            if name in owner:
                raise VeroImportError(
                    f"case {name} is in both {owner[name]}.json and {vero_name}.json "
                    "(splits must be disjoint)"
                )
            owner[name] = vero_name
    return lists


def _entries(manifest: dict[str, Any], lists: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each case's source entry; checks the manifest's membership against the split files."""
    tasks = manifest.get("tasks")
    if not isinstance(tasks, list):
        raise VeroImportError("manifest.json has no 'tasks' list")
    where = {name: vero_name for vero_name, names in lists.items() for name in names}
    entries: dict[str, dict[str, Any]] = {}
    for item in tasks:
        if isinstance(item, str):
            name, entry, partition = item, {"name": item}, None
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            name = item["name"]
            entry = {k: v for k, v in item.items() if k != "partition"}
            partition = item.get("partition")
        else:
            raise VeroImportError("manifest.json 'tasks' holds an entry without a name")
        if name in entries:
            raise VeroImportError(f"case {name} is listed twice in manifest.json")
        if name not in where:
            raise VeroImportError(f"case {name} is in manifest.json but in no split file")
        if partition is not None and partition != where[name]:
            raise VeroImportError(
                f"case {name} is in {where[name]}.json but manifest.json puts it in {partition}"
            )
        entries[name] = entry
    missing = sorted(set(where) - set(entries))
    if missing:
        raise VeroImportError(
            f"case {missing[0]} is in {where[missing[0]]}.json but not in manifest.json"
        )
    return entries


def _check_counts(manifest: dict[str, Any], lists: dict[str, list[str]]) -> None:
    counts = manifest.get("partition_counts")
    if not isinstance(counts, dict):
        raise VeroImportError("manifest.json has no 'partition_counts'")
    for vero_name, names in lists.items():
        if counts.get(vero_name) != len(names):
            raise VeroImportError(
                f"{vero_name}.json has {len(names)} cases but partition_counts says "
                f"{counts.get(vero_name)}"
            )


def partition_digest(lists: dict[str, list[str]]) -> str:
    """VeRO's digest: sha256 of the compact sorted-key JSON of the three lists, as written."""
    data = json.dumps(lists, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()


def import_vero(folder: Path, task_id: str | None = None) -> SplitManifest:
    """Read a VeRO partitions folder and return the holedger split manifest it defines."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotFoundError(f"{folder} is not a folder", hint="give a VeRO partitions folder")
    lists = _split_lists(folder)
    manifest = _read_json(folder / "manifest.json")
    if not isinstance(manifest, dict):
        raise VeroImportError("manifest.json must be a JSON object")
    entries = _entries(manifest, lists)
    _check_counts(manifest, lists)
    declared = manifest.get("partition_digest")
    if declared is not None:
        got = partition_digest(lists)
        if declared != got:
            raise VeroImportError(
                f"partition_digest in manifest.json is {declared}, the split files hash to {got}"
            )
    splits: dict[Split, list[ManifestCase]] = {}
    split_digests: dict[Split, str] = {}
    for vero_name, split in VERO_SPLITS.items():
        cases = []
        for name in sorted(lists[vero_name]):
            try:
                digest = digests.case_digest({"id": name, "source": entries[name]})
            except CanonicalError as exc:
                raise VeroImportError(f"case {name}: its manifest entry {exc.message}") from exc
            cases.append(ManifestCase(id=name, digest=digest))
        splits[split] = cases
        split_digests[split] = digests.split_digest((c.id, c.digest) for c in cases)
    source: dict[str, Any] = {"format": "vero-partitions", "folder": folder.name}
    for key in ("dataset_name", "seed", "partition_digest"):
        if isinstance(manifest.get(key), str):
            source[key] = manifest[key]
    source["partition_counts"] = {k: len(v) for k, v in lists.items()}
    return SplitManifest(
        task_id=task_id or folder.name,
        splits={s: splits[s] for s in SPLITS},
        split_digests={s: split_digests[s] for s in SPLITS},
        manifest_digest=digests.manifest_digest(split_digests),
        source=source,
    )
