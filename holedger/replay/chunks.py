"""Replay's fast path: verify a chunk of consecutive records in one go.

``check_chunk`` takes a chunk of consecutive records of one run, with the keys the
in-order pass trusts, and makes every check of replay that needs nothing from outside the
chunk: each record is canonical with a valid envelope and payload, belongs to the run,
follows the one before it (seq + 1, prev_hash = its hash), is signed by its role's key,
and, when it is a Checkpoint, is the server's, has the size of its seq and carries a note
that the server key signed for this run, with the same size and root. When every record
passes, it returns a ``ChunkSummary``: what the in-order pass still has to check or carry
on (where the chunk starts and ends, its Merkle leaves, the roots its checkpoints claim,
where the run closes, the blobs it names). When anything at all is unusual it returns
None and the engine checks that chunk record by record with its reference pass
(``engine._Verifier.feed``), which names what is wrong.

So this path only ever decides that a whole chunk is fine, and the report is the same
whichever path a chunk took (tests/replay/test_chunks.py replays intact and damaged runs
both ways). It is a pure function of its arguments, so the engine runs it in this process
or in worker processes alike.

Records whose payload ``schemas.recognize`` can recognise by its bytes (GatewayCall, the
bulk of a run, among them) are matched whole by one pattern per event type and never
become objects, and so are checkpoints as the server writes them (``checkpoint_pattern``);
every other record goes through ``parse_record`` and its payload model.
"""

from __future__ import annotations

import binascii
import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from holedger.errors import SchemaError, VerificationError
from holedger.ledger.fastpath import checkpoint_pattern, parse_record, record_pattern
from holedger.ledger.keys import PublicKey
from holedger.ledger.note import parse_checkpoint, verify_note
from holedger.protocol.runs import origin_of
from holedger.schemas.events import EVENT_TYPES, Checkpoint

# Payload fields that name a blob by its SHA-256; replay re-hashes each one.
BLOB_FIELDS: dict[str, tuple[str, ...]] = {
    "TrialCompleted": ("answer_digest", "output_digest", "trace_digest"),
    "GatewayCall": ("request_digest", "response_digest"),
    "SafetyViolation": ("evidence_digest",),
}

# The event types a record of which the chunk check may take on the record pattern alone:
# not these, whose checks need more than their own bytes (keys, Merkle state, closure).
_PARSED_TYPES = frozenset({"RunOpened", "Checkpoint", "RunClosed"})
_PATTERN_TYPES = frozenset(EVENT_TYPES) - _PARSED_TYPES

_sha256 = hashlib.sha256
_a2b = binascii.a2b_base64


@dataclass(frozen=True)
class ChunkJob:
    """A chunk of consecutive records and the keys to check them with.

    ``keys`` are (role, key name, raw public key), exactly the keys the in-order pass
    trusts for each role: a summary counts only if it was made with those.
    """

    run_id: str
    keys: tuple[tuple[str, str, bytes], ...]
    records: list[bytes]


class ChunkSummary(NamedTuple):
    """What the in-order pass needs of a chunk in which every record passed."""

    first_seq: int
    first_prev: str  # the first record's prev_hash: must be the hash of the one before
    last_hash: str  # the last record's event hash
    last_type: str
    leaves: bytes  # the Merkle leaf hashes, 32 bytes each, in order
    checkpoints: tuple[tuple[int, str], ...]  # (offset, root it claims), note verified
    closed: int | None  # offset of the RunClosed, if the chunk has one
    blobs: tuple[tuple[int, str, str, str], ...]  # (offset, event type, field, digest)


class _Run:
    """What checking a run's chunks needs, made once per run and process."""

    def __init__(self, run_id: str, keys: tuple[tuple[str, str, bytes], ...]) -> None:
        self.run_id = run_id
        self.origin = origin_of(run_id)
        # role -> (key id, verifier), both as the records spell them (bytes)
        self.roles: dict[bytes, tuple[bytes, Ed25519PublicKey]] = {}
        self.server: PublicKey | None = None
        self.server_id = b""  # the server key's id (4 bytes)
        for role, name, raw in keys:
            key = PublicKey(name, raw)
            self.roles[role.encode()] = (key.key_id_hex.encode(), key.verifier())
            if role == "server":
                self.server = key
                self.server_id = key.key_id
        self.signers = {(role, key_id) for role, (key_id, _) in self.roles.items()}
        found = record_pattern(run_id, BLOB_FIELDS, _PATTERN_TYPES)
        self.match = found[0].fullmatch if found else _no_match
        self.blobs = found[1] if found else []
        names = ["_key_id", "_prev_hash", "_role", "_seq", "_type"]
        names += [f"_b{n}" for n in range(len(self.blobs))]
        # by number: a name costs a lookup per record (and a missing group is a KeyError
        # here, never a silent read of another group)
        index = found[0].groupindex if found else dict.fromkeys([*names, "_sig"], 0)
        self.groups = tuple(index[name] for name in names)
        self.sig = index["_sig"]
        # Checkpoints as the server writes them: matched whole too, their note read off
        # the pattern's groups (any other checkpoint is parsed the reference way).
        pattern = (
            None
            if self.server is None
            else checkpoint_pattern(run_id, self.origin, self.server.name)
        )
        self.checkpoint = pattern.fullmatch if pattern is not None else _no_match
        cp_index = pattern.groupindex if pattern is not None else {}
        self.checkpoint_groups = tuple(cp_index.get(name, 0) for name in names[:5])
        self.checkpoint_claims = tuple(
            cp_index.get(name, 0)
            for name in ("_size", "_root", "_text", "_text_size", "_text_root", "_note_sig")
        )
        self.checkpoint_sig = cp_index.get("_sig", 0)


def _no_match(raw: bytes) -> None:
    return None


_runs: dict[tuple[str, tuple[tuple[str, str, bytes], ...]], _Run] = {}


def _run(job: ChunkJob) -> _Run:
    key = (job.run_id, job.keys)
    run = _runs.get(key)
    if run is None:
        if len(_runs) > 16:
            _runs.clear()
        run = _runs[key] = _Run(job.run_id, job.keys)
    return run


def check_chunk(job: ChunkJob) -> ChunkSummary | None:
    """The chunk's summary when every record in it passes, else None (see the module).

    Column by column: the records are matched (and their values read) all at once, then
    each check runs over a whole column, so a chunk costs few steps of Python per record.
    """
    run = _run(job)
    records = job.records
    if not records:
        return None
    matches = list(map(run.match, records))
    groups = run.groups
    values = [m.group(*groups) if m is not None else () for m in matches]
    sig = run.sig
    spans = [m.span(sig) if m is not None else (0, 0) for m in matches]
    signed = [raw[: a - 8] + raw[b + 1 :] for raw, (a, b) in zip(records, spans, strict=True)]
    a2b = binascii.a2b_base64
    signatures = [a2b(raw[a:b]) for raw, (a, b) in zip(records, spans, strict=True)]
    checkpoints: list[tuple[int, Checkpoint]] = []  # parsed the reference way
    notes: list[tuple[int, tuple[bytes, ...]]] = []  # matched by the checkpoint pattern
    named: list[tuple[int, str, str, str]] = []  # blobs named by the records parsed here
    if None in matches:  # checkpoints, and records checked the reference way, one by one
        no_blobs = (None,) * len(run.blobs)
        for at in [at for at, match in enumerate(matches) if match is None]:
            raw = records[at]
            written = run.checkpoint(raw)
            if written is not None:
                values[at] = written.group(*run.checkpoint_groups) + no_blobs
                a, b = written.span(run.checkpoint_sig)
                signed[at] = raw[: a - 8] + raw[b + 1 :]
                signatures[at] = a2b(raw[a:b])
                notes.append((at, written.group(*run.checkpoint_claims)))
                continue
            parsed = _parsed(run, raw)
            if parsed is None:
                return None
            values[at], signed[at], signatures[at], checkpoint, blobs = parsed
            named.extend((at, values[at][4].decode(), field, d) for field, d in blobs)
            if checkpoint is not None:
                checkpoints.append((at, checkpoint))
    key_ids, prevs, roles, seq_texts, types, *blob_values = zip(*values, strict=True)
    first = int(seq_texts[0])
    count = len(records)
    hashes = [_sha256(message).hexdigest().encode() for message in signed]
    if (
        list(map(int, seq_texts)) != list(range(first, first + count))
        or list(prevs[1:]) != hashes[:-1]
        or not set(zip(roles, key_ids, strict=True)) <= run.signers
        or b"RunOpened" in types
        or any(roles[at] != b"server" for at, _ in checkpoints)
        or not all(_claims_agree(run, seq_texts[at], claims) for at, claims in notes)
    ):
        return None
    closed: int | None = None
    if b"RunClosed" in types:
        closed = types.index(b"RunClosed")
        if any(etype != b"Checkpoint" for etype in types[closed + 1 :]):
            return None  # only checkpoints may follow RunClosed (and one RunClosed)
    # Signatures last, back to back: Ed25519's tables stay in the CPU's caches.
    verifiers = run.roles
    try:
        for role, message, signature in zip(roles, signed, signatures, strict=True):
            verifiers[role][1].verify(signature, message)
        if notes:
            server = verifiers[b"server"][1]
            for _, (_, _, text, _, _, note_sig) in notes:
                server.verify(_a2b(note_sig)[4:], text.replace(b"\\n", b"\n"))
    except (InvalidSignature, ValueError):
        return None
    if not all(_note_ok(run, first + at, checkpoint) for at, checkpoint in checkpoints):
        return None
    claimed = [(at, checkpoint.root) for at, checkpoint in checkpoints]
    claimed += [(at, claims[1].decode()) for at, claims in notes]
    return ChunkSummary(
        first,
        prevs[0].decode(),
        hashes[-1].decode(),
        types[-1].decode(),
        b"".join([_sha256(b"\x00" + message).digest() for message in signed]),
        tuple(sorted(claimed)),
        closed,
        _named_blobs(run, named, blob_values),
    )


def _named_blobs(
    run: _Run, named: list[tuple[int, str, str, str]], columns: list[tuple[bytes | None, ...]]
) -> tuple[tuple[int, str, str, str], ...]:
    """(offset, event type, field, digest) of every blob the chunk's records name, in
    record order and, within a record, in the order of BLOB_FIELDS: ``named`` for the
    records parsed one by one, and the pattern's blob groups for the others."""
    found = list(named)
    for (etype, field), column in zip(run.blobs, columns, strict=True):
        if column.count(None) + column.count(b"null") == len(column):
            continue
        for at, value in enumerate(column):
            if value is not None and value != b"null":
                found.append((at, etype, field, value[1:-1].decode()))
    found.sort(key=lambda blob: (blob[0], BLOB_FIELDS[blob[1]].index(blob[2])))
    return tuple(found)


def _parsed(
    run: _Run, raw: bytes
) -> tuple[tuple[bytes, ...], bytes, bytes, Checkpoint | None, list[tuple[str, str]]] | None:
    """A record the pattern did not match, parsed and validated the reference way: the
    envelope values the pattern reads (its blob groups: None), its signed bytes,
    signature, Checkpoint payload and named blobs as (field, digest); None when it is not
    a valid record of this run."""
    try:
        rec = parse_record(raw)
        payload = rec.typed_payload()
    except (VerificationError, SchemaError):
        return None
    if rec.run_id != run.run_id:
        return None
    blobs = []
    for field in BLOB_FIELDS.get(rec.type, ()):
        digest = getattr(payload, field)
        if digest:
            blobs.append((field, str(digest)))
    values: tuple[Any, ...] = (
        rec.key_id.encode(),
        rec.prev_hash.encode(),
        rec.role.encode(),
        str(rec.seq).encode(),
        rec.type.encode(),
        *(None for _ in run.blobs),
    )
    checkpoint = payload if isinstance(payload, Checkpoint) else None
    return values, rec.signed, rec.signature, checkpoint, blobs


def _claims_agree(run: _Run, seq: bytes, claims: tuple[bytes, ...]) -> bool:
    """What _note_ok checks of a checkpoint, but its signature, on the checkpoint
    pattern's groups: the payload's size is the record's seq and the note's size, the
    note's root is the payload's, and the note's one signature line has the server
    key's id."""
    size, root, _, text_size, text_root, note_sig = claims
    return (
        size == seq == text_size
        and _a2b(text_root) == bytes.fromhex(root.decode())
        and _a2b(note_sig)[:4] == run.server_id
    )


def _note_ok(run: _Run, seq: int, cp: Checkpoint) -> bool:
    """The checkpoint's own checks that need no Merkle state: its size is its seq, and its
    note is signed by the server key, for this run, with the same size and root."""
    if run.server is None or cp.size != seq:
        return False
    try:
        note = verify_note(cp.note, run.server)
        body = parse_checkpoint(note.text)
    except VerificationError:
        return False
    return body.origin == run.origin and body.size == cp.size and body.root.hex() == cp.root
