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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from holedger.errors import BundleError, CanonicalError, UsageError
from holedger.ledger.keys import PublicKey
from holedger.ledger.note import MAX_NOTE_BYTES, Ed25519NoteVerifier, parse_vkey
from holedger.schemas.canonical import canonical_json, parse_canonical

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
# What a room above this one carries beside the run (holedger.bundles.attachments): a
# one-byte name length, the name (UTF-8), then bytes only that room reads.
KIND_ATTACHMENT = 0x09
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
    KIND_ATTACHMENT: "attachment",
    KIND_END: "end",
}

# Per-kind maximum body length, checked before a body is read.
MAX_BLOB = 64 << 20

LIMITS = {
    KIND_MANIFEST: 64 << 10,
    KIND_KEY: 4 << 10,
    KIND_RECORD: 16 << 20,
    KIND_BLOB: 32 + MAX_BLOB,
    KIND_REDACTED: 32,
    KIND_GIT_OBJECT: 21 + MAX_BLOB,
    KIND_GIT_REF: 20 + 1024,
    KIND_CHECKPOINT: MAX_NOTE_BYTES,
    KIND_ATTACHMENT: 1 + 255 + (4 * MAX_BLOB),
    KIND_END: 64 << 10,
}
MIN_LENGTHS = {
    KIND_BLOB: 32,
    KIND_REDACTED: 32,
    KIND_GIT_OBJECT: 21,
    KIND_GIT_REF: 21,
    KIND_ATTACHMENT: 2,
}

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
        self.entry(KIND_END, canonical_json({"counts": _counted(self.counts)}))


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
    attachment_spans: dict[str, _Span] = field(default_factory=dict)
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

    def attachment(self, name: str) -> bytes:
        return self._read(self.attachment_spans[name])

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
        elif kind == KIND_ATTACHMENT:
            size_of_name = read_exact(1)[0]
            if size_of_name == 0 or 1 + size_of_name > length:
                raise _bad("an attachment without a name")
            attached = _utf8(read_exact(size_of_name), "attachment name")
            if attached in bundle.attachment_spans:
                raise _bad(f"attachment {attached!r} appears twice")
            rest = length - 1 - size_of_name
            bundle.attachment_spans[attached] = _Span(body_at + 1 + size_of_name, rest)
            skip(rest)
        elif kind == KIND_END:
            end = _json(read_exact(length), "end entry")
    if bundle is None:
        raise _bad("no manifest")
    if end is None:
        raise _bad("no end entry: the bundle is truncated")
    expected = end.get("counts")
    actual = _counted(counts)
    if expected != actual:
        raise _bad(f"entry counts {actual} differ from the end entry's {expected}")
    bundle.size = size
    bundle.digest = hasher.hexdigest()
    return bundle


def _counted(counts: dict[str, int]) -> dict[str, int]:
    """The end entry's counts: every kind but manifest and end, and attachments only when
    there are any (so a bundle without them is what it was before they existed)."""
    return {
        k: v for k, v in counts.items() if k not in ("manifest", "end") and (k != "attachment" or v)
    }


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
