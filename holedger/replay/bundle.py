"""Portable run bundles (``.hlb``): one file that a third party can verify offline.

The byte layout is documented in docs/FORMAT.md ("Run bundle"). In short::

    bundle  = "HLBUNDLE" || u16be version || entry* || end entry
    entry   = u8 kind || u32be length || body[length]

with kinds, in non-decreasing order: 0x01 manifest (canonical JSON), 0x02 key,
0x03 record (the event record bytes exactly as signed, in seq order), 0x04 blob
(32-byte SHA-256 || data), 0x05 redacted blob (32-byte SHA-256), 0x06 git object
(u8 type || 20-byte id || raw object body), 0x07 git ref (20-byte id || UTF-8 name),
0x08 checkpoint (a signed note, possibly cosigned by witnesses), 0xff end (canonical
JSON counts of every kind).

Reading is hostile input: every length is checked against its kind's limit and the
bytes left in the file *before* anything is allocated or read, the layout is checked in
full before any record is replayed, nothing in the bundle names a path on disk (git
objects are re-hashed and written by id into a private temporary repository), and any
malformation is one :class:`BundleError`.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from holedger.errors import (
    BundleError,
    CanonicalError,
    HoledgerError,
    UsageError,
    VerificationError,
)
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey
from holedger.ledger.note import (
    MAX_NOTE_BYTES,
    Ed25519NoteVerifier,
    TlogPolicy,
    parse_vkey,
    verify_checkpoint,
)
from holedger.ledger.records import Record
from holedger.protocol.runs import origin_of
from holedger.replay.report import ReplayReport, counted

if TYPE_CHECKING:
    from holedger.replay.inputs import BaselineRun, CheckFactory, Unavailable
from holedger.schemas.canonical import canonical_json, parse_canonical
from holedger.schemas.events import CandidateCommitted, Checkpoint, Model, RunOpened

MAGIC = b"HLBUNDLE"
FORMAT = "holedger-run-bundle"
VERSION = 1
SUPPORTED_VERSIONS = frozenset({VERSION})
HEADER = struct.Struct(">8sH")
ENTRY = struct.Struct(">BI")

KIND_MANIFEST = 0x01
KIND_KEY = 0x02
KIND_RECORD = 0x03
KIND_BLOB = 0x04
KIND_REDACTED = 0x05
KIND_GIT_OBJECT = 0x06
KIND_GIT_REF = 0x07
KIND_CHECKPOINT = 0x08
KIND_END = 0xFF

KIND_NAMES = {
    KIND_MANIFEST: "manifest",
    KIND_KEY: "key",
    KIND_RECORD: "record",
    KIND_BLOB: "blob",
    KIND_REDACTED: "redacted",
    KIND_GIT_OBJECT: "git_object",
    KIND_GIT_REF: "git_ref",
    KIND_CHECKPOINT: "checkpoint",
    KIND_END: "end",
}

# Per-kind maximum body length, checked before a body is read.
MAX_BLOB = 64 << 20
PROGRESS_EVERY = 1000  # records between two progress reports of verify_bundle

LIMITS = {
    KIND_MANIFEST: 64 << 10,
    KIND_KEY: 4 << 10,
    KIND_RECORD: 16 << 20,
    KIND_BLOB: 32 + MAX_BLOB,
    KIND_REDACTED: 32,
    KIND_GIT_OBJECT: 21 + MAX_BLOB,
    KIND_GIT_REF: 20 + 1024,
    KIND_CHECKPOINT: MAX_NOTE_BYTES,
    KIND_END: 64 << 10,
}
MIN_LENGTHS = {KIND_BLOB: 32, KIND_REDACTED: 32, KIND_GIT_OBJECT: 21, KIND_GIT_REF: 21}

GIT_TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}
GIT_TYPE_CODES = {name: code for code, name in GIT_TYPES.items()}
CANDIDATE_REF_PREFIX = "refs/candidates/"


def git_object_id(type_code: int, data: bytes) -> bytes:
    """The SHA-1 object id git gives ``data`` of this type."""
    header = f"{GIT_TYPES[type_code]} {len(data)}\0".encode()
    return hashlib.sha1(header + data, usedforsecurity=False).digest()


# ------------------------------------------------------------------------- writing


class BundleWriter:
    """Writes one bundle, kinds in order, counting entries for the end entry."""

    def __init__(self, handle: BinaryIO, manifest: dict[str, Any]) -> None:
        self.handle = handle
        self.counts: dict[str, int] = {name: 0 for name in KIND_NAMES.values()}
        self.last_kind = 0
        self.bytes_written = 0
        self._write_raw(HEADER.pack(MAGIC, VERSION))
        self.entry(KIND_MANIFEST, canonical_json(manifest))

    def _write_raw(self, data: bytes) -> None:
        self.handle.write(data)
        self.bytes_written += len(data)

    def entry(self, kind: int, body: bytes) -> None:
        if kind < self.last_kind:
            raise ValueError("bundle entries must be written in kind order")
        if len(body) > LIMITS[kind]:
            raise UsageError(
                f"{KIND_NAMES[kind]} of {len(body)} bytes is larger than a bundle allows"
            )
        self.last_kind = kind
        self.counts[KIND_NAMES[kind]] += 1
        self._write_raw(ENTRY.pack(kind, len(body)))
        self._write_raw(body)

    def finish(self) -> None:
        counts = {k: v for k, v in self.counts.items() if k not in ("manifest", "end")}
        self.entry(KIND_END, canonical_json({"counts": counts}))


# ------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Span:
    offset: int
    length: int


@dataclass
class RunBundle:
    """An opened, fully indexed bundle. Bodies of records and blobs are read on demand."""

    path: Path
    handle: BinaryIO
    version: int
    manifest: dict[str, Any]
    keys: dict[str, PublicKey] = field(default_factory=dict)
    record_spans: list[_Span] = field(default_factory=list)
    blob_spans: dict[str, _Span] = field(default_factory=dict)
    redacted_digests: set[str] = field(default_factory=set)
    git_spans: dict[str, tuple[int, _Span]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)
    size: int = 0
    digest: str = ""

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])

    @property
    def redacted_bundle(self) -> bool:
        return bool(self.manifest.get("redacted"))

    def _read(self, span: _Span) -> bytes:
        self.handle.seek(span.offset)
        data = self.handle.read(span.length)
        if len(data) != span.length:
            raise BundleError("bundle changed or was truncated while it was read")
        return data

    def records(self) -> Iterator[bytes]:
        for span in self.record_spans:
            yield self._read(span)

    # BlobSource (holedger.replay.context)
    def blob(self, digest: str) -> bytes | None:
        span = self.blob_spans.get(digest)
        return None if span is None else self._read(span)

    def redacted(self, digest: str) -> bool:
        return digest in self.redacted_digests

    def git_object(self, oid: str) -> tuple[int, bytes] | None:
        entry = self.git_spans.get(oid)
        if entry is None:
            return None
        return entry[0], self._read(entry[1])

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> RunBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bad(message: str) -> BundleError:
    return BundleError(
        f"malformed bundle: {message}",
        hint="the file is truncated or damaged, or is not a holedger bundle",
    )


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = parse_canonical(body)
    except CanonicalError as exc:
        raise _bad(f"{what} is not canonical JSON ({exc.message})") from exc
    if not isinstance(value, dict):
        raise _bad(f"{what} is not a JSON object")
    return value


def _utf8(body: bytes, what: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{what} is not UTF-8") from exc


def _check_manifest(manifest: dict[str, Any], version: int) -> None:
    if manifest.get("format") != FORMAT:
        raise _bad("manifest format is not holedger-run-bundle")
    if manifest.get("version") != version:
        raise _bad("manifest version differs from the header version")
    run_id = manifest.get("run_id")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 64:
        raise _bad("manifest has no run id")
    if not isinstance(manifest.get("redacted"), bool):
        raise _bad("manifest does not say whether blobs are redacted")


def open_bundle(path: str | Path) -> RunBundle:
    """Open and index a bundle, checking its whole layout; BundleError when malformed."""
    path = Path(path)
    try:
        handle: BinaryIO = open(path, "rb")
    except FileNotFoundError as exc:
        raise BundleError(f"no bundle at {path}", hint="check the file name") from exc
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror}") from exc
    try:
        return _index(path, handle)
    except BaseException:
        handle.close()
        raise


def _index(path: Path, handle: BinaryIO) -> RunBundle:
    size = os.fstat(handle.fileno()).st_size
    hasher = hashlib.sha256()

    def read_exact(n: int) -> bytes:
        data = handle.read(n)
        if len(data) != n:
            raise _bad("file ends in the middle of an entry")
        hasher.update(data)
        return data

    def skip(n: int) -> None:
        remaining = n
        while remaining:
            chunk = handle.read(min(remaining, 1 << 20))
            if not chunk:
                raise _bad("file ends in the middle of an entry")
            hasher.update(chunk)
            remaining -= len(chunk)

    if size < HEADER.size:
        raise _bad("file is too short for a bundle header")
    magic, version = HEADER.unpack(read_exact(HEADER.size))
    if magic != MAGIC:
        raise _bad("wrong magic bytes")
    if version not in SUPPORTED_VERSIONS:
        raise BundleError(
            f"bundle format version {version} is not supported (this holedger reads "
            f"{', '.join(str(v) for v in sorted(SUPPORTED_VERSIONS))})",
            hint="upgrade holedger",
        )
    bundle: RunBundle | None = None
    last_kind = 0
    counts: dict[str, int] = {name: 0 for name in KIND_NAMES.values()}
    end: dict[str, Any] | None = None
    while True:
        offset = handle.tell()
        if offset == size:
            break
        if end is not None:
            raise _bad("bytes after the end entry")
        if size - offset < ENTRY.size:
            raise _bad("truncated entry header")
        kind, length = ENTRY.unpack(read_exact(ENTRY.size))
        name = KIND_NAMES.get(kind)
        if name is None:
            raise _bad(f"unknown entry kind 0x{kind:02x}")
        if kind < last_kind:
            raise _bad(f"{name} entry out of order")
        last_kind = kind
        if length > LIMITS[kind] or length < MIN_LENGTHS.get(kind, 0):
            raise _bad(f"{name} entry length {length} is out of bounds")
        body_at = offset + ENTRY.size
        if length > size - body_at:
            raise _bad(f"{name} entry runs past the end of the file")
        counts[name] += 1
        if bundle is None:
            if kind != KIND_MANIFEST:
                raise _bad("the first entry is not the manifest")
            manifest = _json(read_exact(length), "manifest")
            _check_manifest(manifest, version)
            bundle = RunBundle(path, handle, version, manifest)
            continue
        if kind == KIND_MANIFEST:
            raise _bad("a second manifest")
        if kind == KIND_RECORD:
            bundle.record_spans.append(_Span(body_at, length))
            skip(length)
        elif kind in (KIND_BLOB, KIND_REDACTED):
            digest = read_exact(32).hex()
            if digest in bundle.blob_spans or digest in bundle.redacted_digests:
                raise _bad(f"blob {digest[:12]} appears twice")
            if kind == KIND_BLOB:
                bundle.blob_spans[digest] = _Span(body_at + 32, length - 32)
                skip(length - 32)
            elif not bundle.redacted_bundle:
                raise _bad("a redacted blob in a bundle whose manifest says it is not redacted")
            else:
                bundle.redacted_digests.add(digest)
        elif kind == KIND_GIT_OBJECT:
            head = read_exact(21)
            if head[0] not in GIT_TYPES:
                raise _bad(f"git object of unknown type {head[0]}")
            oid = head[1:].hex()
            if oid in bundle.git_spans:
                raise _bad(f"git object {oid[:12]} appears twice")
            bundle.git_spans[oid] = (head[0], _Span(body_at + 21, length - 21))
            skip(length - 21)
        elif kind == KIND_GIT_REF:
            body = read_exact(length)
            ref = _utf8(body[20:], "git ref name")
            if not ref.startswith(CANDIDATE_REF_PREFIX) or ref in bundle.refs:
                raise _bad("git ref is not a distinct refs/candidates/ name")
            bundle.refs[ref] = body[:20].hex()
        elif kind == KIND_KEY:
            _add_key(bundle, _json(read_exact(length), "key entry"))
        elif kind == KIND_CHECKPOINT:
            bundle.checkpoints.append(_utf8(read_exact(length), "checkpoint"))
        elif kind == KIND_END:
            end = _json(read_exact(length), "end entry")
    if bundle is None:
        raise _bad("no manifest")
    if end is None:
        raise _bad("no end entry: the bundle is truncated")
    expected = end.get("counts")
    actual = {k: v for k, v in counts.items() if k not in ("manifest", "end")}
    if expected != actual:
        raise _bad(f"entry counts {actual} differ from the end entry's {expected}")
    bundle.size = size
    bundle.digest = hasher.hexdigest()
    return bundle


def _add_key(bundle: RunBundle, entry: dict[str, Any]) -> None:
    role, vkey = entry.get("role"), entry.get("vkey")
    if not isinstance(role, str) or not isinstance(vkey, str) or role in bundle.keys:
        raise _bad("key entry needs a distinct role and a vkey")
    try:
        verifier = parse_vkey(vkey)
    except UsageError as exc:
        raise _bad(f"key entry: {exc.message}") from exc
    if not isinstance(verifier, Ed25519NoteVerifier):
        raise _bad("key entry is not an Ed25519 key")
    bundle.keys[role] = verifier.key


# ------------------------------------------------------------------ git re-checks


class GitCheck:
    """Re-checks each CandidateCommitted event against the bundled git objects.

    The bundled objects were re-hashed and written into a private temporary repository
    (:func:`_candidate_repo`): every object's id must be the SHA-1 git gives its bytes,
    and each candidate's commit must exist, point at the recorded tree and parent, and
    have its whole tree present.
    """

    name = "git"

    def __init__(self, bundle: RunBundle, repo: Path | None, unhashed: list[str]) -> None:
        self.bundle = bundle
        self.repo = repo
        self.unhashed = unhashed
        self.events: list[tuple[int, CandidateCommitted]] = []

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted):
            self.events.append((rec.seq, payload))

    def finish(self, out: Any) -> None:
        bundle = self.bundle
        if self.repo is None:
            detail = "candidate history not in the bundle: commit ids not re-checked"
            out.declare("git", detail)
            out.warn(
                "git_history",
                False,
                "the bundle holds no candidate history: the candidates' code (the nominated "
                "one's included) and the scan for hard-coded test answers cannot be checked; "
                "ask for a bundle with it",
            )
            out.section("git", {"included": False, "candidates": len(self.events)})
            return
        out.declare("git", "every candidate commit id, tree and parent re-checked")
        checked = self._check(out)
        out.section(
            "git",
            {"included": True, "objects": len(bundle.git_spans), "candidates_checked": checked},
        )

    def _check(self, out: Any) -> int:
        import pygit2

        if self.unhashed:
            oid = self.unhashed[0]
            out.fail(None, None, f"git object {oid[:12]} does not hash to its id", check="git")
            return 0
        repo = pygit2.Repository(str(self.repo))
        checked = 0
        for seq, cand in self.events:
            problem = _candidate_problem(repo, cand)
            if problem:
                out.fail(seq, "CandidateCommitted", problem, check="git")
            else:
                checked += 1
        for ref, oid in self.bundle.refs.items():
            if ref != CANDIDATE_REF_PREFIX + oid:
                out.fail(None, None, f"git ref {ref} points at {oid[:12]}", check="git")
        return checked


def _candidate_problem(repo: Any, cand: CandidateCommitted) -> str | None:
    import pygit2

    try:
        commit = repo[cand.candidate]
    except (KeyError, ValueError):
        return f"commit {cand.candidate[:12]} is not in the bundled history"
    if not isinstance(commit, pygit2.Commit):
        return f"{cand.candidate[:12]} is not a commit"
    if str(commit.tree_id) != cand.tree:
        return f"commit {cand.candidate[:12]} has another tree than the recorded one"
    parents = [str(p) for p in commit.parent_ids]
    if (cand.parent is None and parents) or (cand.parent is not None and parents != [cand.parent]):
        return f"commit {cand.candidate[:12]} parents differ from the recorded parent"
    missing = _missing_in_tree(repo, commit.tree_id)
    if missing:
        return f"commit {cand.candidate[:12]} tree is incomplete ({missing[:12]} missing)"
    return None


def _missing_in_tree(repo: Any, tree_id: Any) -> str | None:
    stack = [tree_id]
    seen: set[str] = set()
    while stack:
        oid = stack.pop()
        key = str(oid)
        if key in seen:
            continue
        seen.add(key)
        if oid not in repo.odb:
            return key
        obj = repo[oid]
        if obj.type_str == "tree":
            for entry in obj:
                if entry.filemode == 0o160000:  # submodule: not part of the history
                    continue
                stack.append(entry.id)
    return None


class BundleChecks:
    """Checks that only a bundle has: its key list, its checkpoint notes, witnesses.

    Runs as the last projection, so it sees the (size, root) of every Checkpoint event
    that passed integrity. Every checkpoint note (bundled, or published elsewhere and
    given to ``verify``) must be signed by the run's server key, name this run's origin
    and equal one of those checkpoints: a log rewritten or truncated after the note was
    published fails here. With a witness policy, a note for the final checkpoint must
    carry cosignatures that meet its quorum.
    """

    name = "bundle"

    def __init__(
        self,
        bundle: RunBundle,
        opened: RunOpened,
        external: Sequence[str],
        policy: TlogPolicy | None,
    ) -> None:
        self.bundle = bundle
        self.opened = opened
        self.external = list(external)
        self.policy = policy
        self.roots: dict[int, str] = {}

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, Checkpoint):
            self.roots[payload.size] = payload.root

    def finish(self, out: Any) -> None:
        declared = {role: _declared_key(info) for role, info in self.opened.keys.items()}
        out.declare("bundle_keys", "the bundle's key list equals RunOpened's keys")
        if {r: (k.name, k.raw) for r, k in self.bundle.keys.items()} != {
            r: (k.name, k.raw) for r, k in declared.items()
        }:
            out.fail(None, None, "bundle key list differs from RunOpened", check="bundle_keys")
        notes = [("bundled", n) for n in self.bundle.checkpoints]
        notes += [("external", n) for n in self.external]
        server = declared.get("server")
        if notes:
            out.declare("published_checkpoints", "every checkpoint note matches the log")
        final_size = max(self.roots) if self.roots else -1
        witnessed: list[dict[str, Any]] = []
        quorum_met = False
        for source, note in notes:
            entry = self._check_note(out, source, note, server, final_size)
            if entry is not None:
                witnessed.append(entry)
                quorum_met = quorum_met or bool(entry["final"] and entry["quorum"])
        if self.policy is not None:
            out.declare("witnesses", "the final checkpoint meets the witness policy")
            if not quorum_met:
                finals = [e for e in witnessed if e["final"]]
                best = max((len(e["witnesses"]) for e in finals), default=0)
                external = any(e["source"] == "external" for e in finals)
                out.fail(
                    None,
                    None,
                    f"no checkpoint note for the final checkpoint meets the witness quorum "
                    f"({quorum_text(self.policy)}): the best carries "
                    f"{counted(best, 'cosignature')} of the policy's witnesses"
                    + (
                        ""
                        if external
                        else "; a bundle's own notes carry none: give the cosigned note "
                        "with --checkpoint"
                    ),
                    check="witnesses",
                )
        if notes or self.policy is not None:
            out.section("checkpoint_notes", witnessed)
        out.section(
            "bundle",
            {
                "path": self.bundle.path.name,
                "format_version": self.bundle.version,
                "sha256": self.bundle.digest,
                "bytes": self.bundle.size,
                # What the bundle holds, not what its (unsigned) manifest says: a flag
                # flipped to true on a whole bundle does not make its report say redacted.
                "redacted": bool(self.bundle.redacted_digests),
            },
        )

    def _check_note(
        self, out: Any, source: str, note: str, server: PublicKey | None, final_size: int
    ) -> dict[str, Any] | None:
        check = "published_checkpoints"
        if server is None:
            out.fail(None, None, f"{source} checkpoint: no server key declared", check=check)
            return None
        policy = self.policy
        log_keys = policy.logs if policy is not None and policy.logs else [server]
        witnesses = list(policy.witnesses.values()) if policy is not None else []
        try:
            verified = verify_checkpoint(
                note, log_keys, witnesses=witnesses, origin=origin_of(self.bundle.run_id)
            )
        except VerificationError as exc:
            out.fail(None, None, f"{source} checkpoint note: {exc.message}", check=check)
            return None
        cp = verified.checkpoint
        root = self.roots.get(cp.size)
        if root is None:
            out.fail(
                None,
                None,
                f"{source} checkpoint of size {cp.size} is not in the log (truncated or rewritten)",
                check=check,
            )
            return None
        if root != cp.root.hex():
            out.fail(
                None,
                None,
                f"{source} checkpoint of size {cp.size} has another root: the log was rewritten",
                check=check,
            )
            return None
        names = policy.witness_names_for(verified.cosigners) if policy is not None else set()
        return {
            "source": source,
            "size": cp.size,
            "final": cp.size == final_size,
            "witnesses": sorted(verified.witnesses),
            "quorum": policy.satisfied(names) if policy is not None else None,
        }


def quorum_text(policy: TlogPolicy) -> str:
    """The quorum for people: "2 of the 3 witnesses given", or the policy's own name."""
    group = policy.groups.get(policy.quorum)
    if (
        group is not None
        and policy.quorum == "witnesses"
        and set(group.members) == set(policy.witnesses)
    ):  # made from --witness and --quorum
        return (
            f"{group.threshold} of the {counted(len(group.members), 'witness', 'witnesses')} given"
        )
    return f"the policy's quorum {policy.quorum!r}"


def _declared_key(info: Any) -> PublicKey:
    return PublicKey.declared(str(info.name), str(info.public_key))


# --------------------------------------------------------------------- exporting


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
    from holedger.replay.chunks import BLOB_FIELDS

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
) -> ExportSummary:
    """Write ``run_id`` of ``ledger`` as a bundle (atomically: temp file, then rename)."""
    from holedger.ledger.note import parse_note

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
            key = _declared_key(info)
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


# ---------------------------------------------------------------------- verifying


def _candidate_repo(bundle: RunBundle, where: Path) -> list[str]:
    """Write the bundled git objects that hash to their ids into a bare repository at
    ``where`` (for GitCheck and the leakage check's candidate scan); the ids of those
    that do not, which GitCheck reports."""
    import pygit2

    repo = pygit2.init_repository(str(where), bare=True)
    unhashed = []
    for oid, (type_code, span) in bundle.git_spans.items():
        data = bundle._read(span)
        if git_object_id(type_code, data).hex() == oid:
            repo.odb.write(type_code, data)
        else:
            unhashed.append(oid)
    return unhashed


def verify_bundle(
    path: str | Path,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    external_checkpoints: Sequence[str] = (),
    policy: TlogPolicy | None = None,
    checks: Sequence[CheckFactory] | None = None,
    progress: Callable[[int, int], None] | None = None,
    task: str | None = None,
    baseline: str | Path | BundleBaselines | None = None,
) -> ReplayReport:
    """Replay a bundle with the replay engine; returns the ReplayReport (plus sections).

    ``external_checkpoints`` are checkpoint notes published elsewhere: each must be signed
    by the run's server key and match a checkpoint of the bundled log (a rewrite or a
    truncation fails). ``policy`` (a :class:`~holedger.ledger.note.TlogPolicy`) requires
    witness cosignatures on the bundle's final checkpoint. ``checks`` defaults to the
    registered replay checks; the bundle's own checks always run. ``progress``,
    when given, is called with (records read, records in the bundle) every
    PROGRESS_EVERY records and at the end. ``task`` (a task name or folder) is the task
    the leakage audit reads (default: the task the run names, if bundled with holedger).
    ``baseline`` is the bundle of the run's seed-baseline run: it is verified too (same
    keys) and checked against the pinned E(H0) (check ``baseline``; a warning without it);
    a :class:`BundleBaselines` given instead is shared, so runs pinned to one baseline
    verify it once.
    """
    from holedger.replay.checks import CHECKS
    from holedger.replay.engine import with_progress
    from holedger.replay.inputs import CheckContext, CheckInputs
    from holedger.replay.runs import verify_records

    if checks is None:
        checks = CHECKS
    if baseline is not None and not isinstance(baseline, BundleBaselines):
        baseline = BundleBaselines(baseline, trusted_keys, task)

    with open_bundle(path) as bundle, tempfile.TemporaryDirectory(prefix="holedger-git-") as tmp:
        repo = Path(tmp) if bundle.git_spans else None
        unhashed: list[str] = []

        def git(ctx: CheckContext) -> GitCheck:
            return GitCheck(bundle, repo, unhashed)

        def own(ctx: CheckContext) -> BundleChecks:
            return BundleChecks(bundle, ctx.opened, external_checkpoints, policy)

        try:
            # The candidates' history, when bundled, becomes one repository: GitCheck
            # re-checks the commits in it, and the leakage check scans it as replay scans
            # the run's own.
            if repo is not None:
                unhashed += _candidate_repo(bundle, repo)
            stored = bundle.records()
            records = stored
            if progress is not None:
                batches = iter(lambda: list(islice(stored, PROGRESS_EVERY)), [])
                records = with_progress(batches, len(bundle.record_spans), progress)
            return verify_records(
                bundle.run_id,
                records,
                bundle,
                trusted_keys=trusted_keys,
                checks=[*checks, git, own],
                inputs=CheckInputs(task=task or None, run_repo=repo, baselines=baseline),
            )
        except HoledgerError:
            raise
        except Exception as exc:  # hostile content must end in one clear error
            raise BundleError(
                f"bundle cannot be replayed: {type(exc).__name__}: {exc}",
                hint="the bundle's content is not a run holedger can read",
            ) from exc


class BundleBaselines:
    """The baseline run in a bundle file given with ``verify --baseline``: it is verified
    when first asked for (an unreadable file raises the bundle's error, naming the file)."""

    given = True  # named by the user: the check says so when the run pins no baseline

    def __init__(
        self, path: str | Path, trusted_keys: Sequence[PublicKey], task: str | None = None
    ) -> None:
        self.path = Path(path)
        self.trusted_keys = list(trusted_keys)
        self.task = task
        self._found: BaselineRun | None = None

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        if self._found is None:
            self._found = self._verify()
        return self._found  # another run than ``run_id`` fails the comparison

    def _verify(self) -> BaselineRun:
        from holedger.replay.checks import CHECKS
        from holedger.replay.checks.baseline import baseline_run, capturing

        checks, facts = capturing(CHECKS)
        try:
            report = verify_bundle(
                self.path, trusted_keys=self.trusted_keys, checks=checks, task=self.task
            )
        except HoledgerError as exc:  # the same error, naming the file it is about
            raise type(exc)(f"baseline bundle {self.path}: {exc.message}", hint=exc.hint) from exc
        return baseline_run(report.run_id, report, facts)
