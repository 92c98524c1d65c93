"""Writing a run of a ledger as a bundle (the layout is holedger.bundles.format's)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holedger.bundles.checks import declared_key
from holedger.bundles.format import (
    CANDIDATE_REF_PREFIX,
    FORMAT,
    KIND_ATTACHMENT,
    KIND_BLOB,
    KIND_CHECKPOINT,
    KIND_GIT_OBJECT,
    KIND_GIT_REF,
    KIND_KEY,
    KIND_RECORD,
    KIND_REDACTED,
    VERSION,
    BundleWriter,
)
from holedger.errors import BundleError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.note import parse_note
from holedger.ledger.records import Record
from holedger.replay.chunks import BLOB_FIELDS
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import RunOpened


@dataclass(frozen=True)
class ExportSummary:
    path: Path
    run_id: str
    events: int
    blobs: int
    redacted: int
    git_objects: int
    checkpoints: int
    bytes: int
    digest: str


def _blob_digests(rec: Record) -> Iterable[str]:
    for name in BLOB_FIELDS.get(rec.type, ()):
        digest = rec.payload.get(name)
        if isinstance(digest, str) and digest:
            yield digest


def export_bundle(
    ledger: Any,
    run_id: str,
    out_path: str | Path,
    *,
    redact: bool = False,
    repo_path: Path | None = None,
    checkpoints: Sequence[str] = (),
    attachments: Mapping[str, bytes] | None = None,
) -> ExportSummary:
    """Write ``run_id`` of ``ledger`` as a bundle (atomically: temp file, then rename);
    ``attachments`` (name -> bytes) are carried as they are (holedger.bundles.attachments)."""
    out_path = Path(out_path)
    first = ledger.first_record(run_id)
    if first.type != "RunOpened":
        raise BundleError(f"run {run_id} does not start with RunOpened")
    opened = first.typed_payload()
    assert isinstance(opened, RunOpened)
    for note in checkpoints:
        try:
            parse_note(note)
        except VerificationError as exc:
            raise UsageError(f"not a signed checkpoint note: {exc.message}") from exc
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "run_id": run_id,
        "origin": opened.origin,
        "redacted": redact,
    }
    tmp = out_path.with_name(out_path.name + ".partial")
    digests: list[str] = []
    seen: set[str] = set()
    candidates: list[str] = []
    events = 0
    with open(tmp, "wb") as handle:
        writer = BundleWriter(handle, manifest)
        for role, info in sorted(opened.keys.items()):
            key = declared_key(info)
            writer.entry(KIND_KEY, canonical_json({"role": role, "vkey": key.vkey()}))
        for _, raw in ledger.raw_records(run_id):
            writer.entry(KIND_RECORD, raw)
            events += 1
            try:
                rec = parse_record(raw)
            except Exception:  # exported as stored; the verifier reports it
                continue
            for digest in _blob_digests(rec):
                if digest not in seen:
                    seen.add(digest)
                    digests.append(digest)
            if rec.type == "CandidateCommitted":
                candidates.append(str(rec.payload.get("candidate", "")))
        present = 0
        for digest in sorted(digests):
            if not redact and ledger.has_blob(digest):
                writer.entry(KIND_BLOB, bytes.fromhex(digest) + ledger.get_blob(digest))
                present += 1
        for digest in sorted(digests):
            if redact:
                writer.entry(KIND_REDACTED, bytes.fromhex(digest))
        git_objects = _write_git(writer, repo_path, candidates)
        for note in checkpoints:
            writer.entry(KIND_CHECKPOINT, note.encode())
        for name, data in sorted((attachments or {}).items()):
            label = name.encode()
            writer.entry(KIND_ATTACHMENT, bytes([len(label)]) + label + data)
        writer.finish()
        handle.flush()
        os.fsync(handle.fileno())
        written = writer.bytes_written
    os.replace(tmp, out_path)
    with open(out_path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return ExportSummary(
        out_path,
        run_id,
        events,
        present,
        len(digests) if redact else 0,
        git_objects,
        len(checkpoints),
        written,
        digest,
    )


def _write_git(writer: BundleWriter, repo_path: Path | None, candidates: list[str]) -> int:
    if repo_path is None or not (repo_path / "HEAD").exists():
        return 0
    import pygit2

    repo = pygit2.Repository(str(repo_path))
    tips: list[str] = []
    for ref in repo.references:
        if ref.startswith(CANDIDATE_REF_PREFIX):
            tips.append(str(repo.references[ref].target))
    tips.extend(c for c in candidates if c)
    order: list[Any] = []
    seen: set[str] = set()
    stack = [pygit2.Oid(hex=t) for t in tips if _is_hex_oid(t)]
    while stack:
        oid = stack.pop()
        key = str(oid)
        if key in seen or oid not in repo.odb:
            continue
        seen.add(key)
        order.append(oid)
        obj = repo[oid]
        if isinstance(obj, pygit2.Commit):
            stack.append(obj.tree_id)
            stack.extend(obj.parent_ids)
        elif isinstance(obj, pygit2.Tree):
            stack.extend(e.id for e in obj if e.filemode != 0o160000)
    for oid in sorted(order, key=str):
        type_code, data = repo.odb.read(oid)
        writer.entry(KIND_GIT_OBJECT, bytes([type_code]) + oid.raw + data)
    for ref in sorted(repo.references):
        if ref.startswith(CANDIDATE_REF_PREFIX):
            target = repo.references[ref].target
            if str(target) in seen:
                writer.entry(KIND_GIT_REF, bytes.fromhex(str(target)) + ref.encode())
    return len(order)


def _is_hex_oid(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)
