"""C2SP signed notes, checkpoints and cosignatures (tlog proofs and policies: tlog.py).

Specifications implemented here (all at c2sp.org):

* ``signed-note`` v1: a note is its text (UTF-8, no control characters but newline,
  ending in a newline), one blank line, then signature lines
  ``\\u2014 <name> base64(key_id[4] || signature)\\n``. The text is split from the
  signatures at the *last* blank line. A signature counts only when both the key name
  and the key id match a configured verifier; unknown signatures are ignored, a known
  signature that fails rejects the note, and a note with no verified signature is
  rejected. Ed25519 (type 0x01) signs the text bytes.
* ``tlog-checkpoint`` v1: the text is ``origin\\nsize\\nbase64(root)\\n`` plus optional
  non-empty extension lines.
* ``tlog-cosignature`` v1 (type 0x04): key id ``SHA-256(name || 0x0A || 0x04 || pk)[:4]``,
  signature ``u64be timestamp || Ed25519(message)`` with the message
  ``"cosignature/v1\\ntime <timestamp>\\n" || checkpoint text``.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from holedger.errors import UsageError, VerificationError
from holedger.ledger.keys import (
    ALG_ED25519,
    PublicKey,
    SigningKey,
    key_id_bytes,
    key_id_mismatch,
    vkey_parts,
)
from holedger.schemas.canonical import b64decode_strict

EM_DASH = "\u2014"
MAX_NOTE_BYTES = 1 << 20
MAX_SIGNATURES = 100  # the spec asks for at least 16; Go's sumdb/note allows 100
ALG_COSIGNATURE_V1 = 0x04
COSIGNATURE_HEADER = "cosignature/v1"
MAX_TIMESTAMP = (1 << 63) - 1


# ---------------------------------------------------------------------------- notes


@dataclass(frozen=True)
class NoteSignature:
    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        blob = base64.b64encode(self.key_id + self.signature).decode()
        return f"{EM_DASH} {self.name} {blob}\n"


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[NoteSignature, ...]

    def render(self) -> str:
        return self.text + "\n" + "".join(sig.line() for sig in self.signatures)


def _valid_key_name(name: str) -> bool:
    return bool(name) and "+" not in name and not any(c.isspace() for c in name)


_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")  # every character below space but newline


def _check_note_chars(text: str) -> None:
    if _CONTROL.search(text):
        raise VerificationError("note contains a control character")


def parse_note(note: str | bytes) -> Note:
    """Split a signed note into its text and signature lines (nothing is verified)."""
    if isinstance(note, bytes):
        if len(note) > MAX_NOTE_BYTES:
            raise VerificationError("note is too large")
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VerificationError("note is not UTF-8") from exc
    else:
        if len(note) > MAX_NOTE_BYTES:
            raise VerificationError("note is too large")
        try:
            size = len(note.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise VerificationError("note is not valid UTF-8 text") from exc
        if size > MAX_NOTE_BYTES:
            raise VerificationError("note is too large")
    _check_note_chars(note)
    split = note.rfind("\n\n")
    if split < 0:
        raise VerificationError("note has no blank line before its signatures")
    text, sig_block = note[: split + 1], note[split + 2 :]
    if not sig_block.endswith("\n"):
        raise VerificationError("note's signature block does not end with a newline")
    lines = sig_block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise VerificationError(f"note has more than {MAX_SIGNATURES} signatures")
    signatures = []
    for line in lines:
        if not line.startswith(EM_DASH + " "):
            raise VerificationError("malformed note signature line")
        parts = line[2:].split(" ")
        if len(parts) != 2 or not _valid_key_name(parts[0]):
            raise VerificationError("malformed note signature line")
        name, blob = parts
        raw = b64decode_strict(blob)
        if raw is None:
            raise VerificationError("note signature is not base64")
        if len(raw) < 5:
            raise VerificationError("note signature is too short")
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    return Note(text, tuple(signatures))


class NoteVerifier(Protocol):
    """One configured key: its (name, key id) and how it checks a signature on a text."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> bytes: ...

    def verify_text(self, text: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True)
class Ed25519NoteVerifier:
    """A signed-note Ed25519 key (type 0x01)."""

    key: PublicKey

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def key_id(self) -> bytes:
        return self.key.key_id

    def verify_text(self, text: bytes, signature: bytes) -> bool:
        return len(signature) == 64 and self.key.verify(signature, text)

    def vkey(self) -> str:
        return self.key.vkey()


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    """The tlog-cosignature v1 key id: SHA-256(name || 0x0A || 0x04 || pk)[:4]."""
    return key_id_bytes(name, public_key, ALG_COSIGNATURE_V1)


def cosignature_message(timestamp: int, checkpoint_text: str) -> bytes:
    """The bytes a cosigner signs: header line, time line, the checkpoint text."""
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise VerificationError("cosignature timestamp is out of range")
    return f"{COSIGNATURE_HEADER}\ntime {timestamp}\n{checkpoint_text}".encode()


@dataclass(frozen=True)
class CosignatureVerifier:
    """A witness key for tlog-cosignature v1 (type 0x04)."""

    key: PublicKey

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def key_id(self) -> bytes:
        return cosigner_key_id(self.key.name, self.key.raw)

    def verify_text(self, text: bytes, signature: bytes) -> bool:
        if len(signature) != 8 + 64:
            return False
        (timestamp,) = struct.unpack(">Q", signature[:8])
        if timestamp > MAX_TIMESTAMP:
            return False
        try:
            message = cosignature_message(timestamp, text.decode())
        except (UnicodeDecodeError, VerificationError):
            return False
        return self.key.verify(signature[8:], message)

    def vkey(self) -> str:
        blob = base64.b64encode(bytes([ALG_COSIGNATURE_V1]) + self.key.raw).decode()
        return f"{self.name}+{self.key_id.hex()}+{blob}"


AnyVerifier = Ed25519NoteVerifier | CosignatureVerifier


def parse_vkey(text: str) -> AnyVerifier:
    """Parse a verifier key ``name+hex(id)+base64(type || key)`` of type 0x01 or 0x04."""
    name, hex_id, raw, _ = vkey_parts(text, hint="name+keyid+base64")
    if not _valid_key_name(name):
        raise UsageError(f"bad key name in verifier key {name!r}")
    if len(raw) != 33 or raw[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
        raise UsageError("verifier key is not an Ed25519 (0x01) or cosignature/v1 (0x04) key")
    key = PublicKey(name, raw[1:]).require_sound()
    verifier: AnyVerifier = (
        Ed25519NoteVerifier(key) if raw[0] == ALG_ED25519 else CosignatureVerifier(key)
    )
    if verifier.key_id.hex() != hex_id:
        raise key_id_mismatch(name, hex_id, key.raw, raw[0])
    return verifier


@dataclass(frozen=True)
class OpenedNote:
    """A note whose text is vouched for by at least one configured key."""

    text: str
    verified: tuple[NoteSignature, ...]
    unverified: tuple[NoteSignature, ...]
    verified_by: tuple[str, ...] = field(default=())  # vkeys of the keys that verified


def open_note(note: str | bytes, verifiers: Sequence[NoteVerifier]) -> OpenedNote:
    """Verify a signed note against configured keys, following the signed-note rules."""
    parsed = parse_note(note)
    text = parsed.text.encode()
    by_id: dict[tuple[str, bytes], list[NoteVerifier]] = {}
    for v in verifiers:
        by_id.setdefault((v.name, v.key_id), []).append(v)
    verified: list[NoteSignature] = []
    unverified: list[NoteSignature] = []
    seen: set[tuple[str, bytes]] = set()
    names: list[str] = []
    for sig in parsed.signatures:
        matches = by_id.get((sig.name, sig.key_id), [])
        if not matches:
            if sig not in unverified:
                unverified.append(sig)
            continue
        if len({_verifier_identity(m) for m in matches}) > 1:
            raise VerificationError(f"ambiguous key {sig.name}+{sig.key_id.hex()}")
        if not matches[0].verify_text(text, sig.signature):
            raise VerificationError(f"invalid signature for key {sig.name}+{sig.key_id.hex()}")
        if (sig.name, sig.key_id) not in seen:
            seen.add((sig.name, sig.key_id))
            verified.append(sig)
            names.append(f"{sig.name}+{sig.key_id.hex()}")
    if not verified:
        raise VerificationError("note has no verifiable signatures")
    return OpenedNote(parsed.text, tuple(verified), tuple(unverified), tuple(names))


def _verifier_identity(v: NoteVerifier) -> tuple[str, bytes, str]:
    key = getattr(v, "key", None)
    raw = key.raw if isinstance(key, PublicKey) else b""
    return (v.name, raw, type(v).__name__)


def sign_note(text: str, key: SigningKey) -> str:
    """A signed note over ``text`` with one Ed25519 signature."""
    if not text.endswith("\n"):
        raise ValueError("note text must end with a newline")
    _check_note_chars(text)
    return text + "\n" + note_signature(text, key).line()


def note_signature(text: str, key: SigningKey) -> NoteSignature:
    """The Ed25519 (type 0x01) signature line of ``key`` over a note text."""
    return NoteSignature(key.name, key.key_id, key.sign(text.encode()))


def add_signatures(note: str, signatures: Iterable[NoteSignature]) -> str:
    """Append signature lines to an already signed note."""
    parse_note(note)
    return note + "".join(sig.line() for sig in signatures)


def verify_note(note: str, key: PublicKey) -> OpenedNote:
    """Check that ``key`` signed ``note``; signatures by other keys are ignored."""
    return open_note(note, [Ed25519NoteVerifier(key)])


# ---------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class CheckpointText:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        ext = "".join(line + "\n" for line in self.extensions)
        return checkpoint_body(self.origin, self.size, self.root) + ext


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    """The tlog-checkpoint text of a tree (no extension lines)."""
    if not origin or "\n" in origin:
        raise ValueError("checkpoint origin must be one non-empty line")
    if len(root) != 32:
        raise ValueError("checkpoint root must be 32 bytes")
    if size < 0:
        raise ValueError("checkpoint size must not be negative")
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def parse_checkpoint(text: str) -> CheckpointText:
    """Parse a checkpoint note *text* (verify the note first, then parse its text)."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise VerificationError("checkpoint body must have origin, size and root lines")
    origin, size_s, root_b64 = lines[0], lines[1], lines[2]
    if not origin:
        raise VerificationError("checkpoint origin is empty")
    if not size_s.isascii() or not size_s.isdigit() or (size_s != "0" and size_s[0] == "0"):
        raise VerificationError("checkpoint size is not a decimal number")
    if len(size_s) > 20 or int(size_s) >= 1 << 64:
        raise VerificationError("checkpoint size is out of range")
    root = b64decode_strict(root_b64)
    if root is None:
        raise VerificationError("checkpoint root is not base64")
    if len(root) != 32:
        raise VerificationError("checkpoint root is not 32 bytes")
    extensions = tuple(lines[3:-1])
    if any(not line for line in extensions):
        raise VerificationError("checkpoint extension lines must be non-empty")
    return CheckpointText(origin, int(size_s), root, extensions)


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose log signature verified, and the witnesses that cosigned it."""

    checkpoint: CheckpointText
    note: str
    log_key: str
    witnesses: tuple[str, ...]
    cosigned_at: tuple[tuple[str, int], ...]
    # (name, key id) of each cosigner: a name alone does not identify a witness key
    cosigners: tuple[tuple[str, bytes], ...] = ()


def verify_checkpoint(
    note: str,
    log_keys: Sequence[PublicKey],
    *,
    witnesses: Sequence[PublicKey] = (),
    origin: str | None = None,
) -> VerifiedCheckpoint:
    """Verify a checkpoint signed by one of ``log_keys``; report which witnesses cosigned.

    A witness listed here whose cosignature fails to verify rejects the note (it is a
    known key); cosignatures by unlisted keys are ignored.
    """
    log_verifiers = [Ed25519NoteVerifier(k) for k in log_keys]
    witness_verifiers = [CosignatureVerifier(k) for k in witnesses]
    opened = open_note(note, [*log_verifiers, *witness_verifiers])
    log_ids = {(v.name, v.key_id) for v in log_verifiers}
    signers = [s for s in opened.verified if (s.name, s.key_id) in log_ids]
    if not signers:
        raise VerificationError("checkpoint is not signed by a trusted log key")
    cp = parse_checkpoint(opened.text)
    if origin is not None and cp.origin != origin:
        raise VerificationError(f"checkpoint origin {cp.origin!r} is not {origin!r}")
    wit_ids = {(v.name, v.key_id): v for v in witness_verifiers}
    cosigns = [s for s in opened.verified if (s.name, s.key_id) in wit_ids]
    cosigned = [(s.name, struct.unpack(">Q", s.signature[:8])[0]) for s in cosigns]
    return VerifiedCheckpoint(
        cp,
        note,
        f"{signers[0].name}+{signers[0].key_id.hex()}",
        tuple(name for name, _ in cosigned),
        tuple(cosigned),
        tuple((s.name, s.key_id) for s in cosigns),
    )


def cosign_checkpoint(note: str, witness: SigningKey, timestamp: int) -> str:
    """Append a tlog-cosignature v1 line by ``witness`` to a signed checkpoint note.

    The caller (a witness) must have verified the log signature and the consistency with
    what it saw before; this function only signs.
    """
    parsed = parse_note(note)
    parse_checkpoint(parsed.text)
    return note + cosignature_line(parsed.text, witness, timestamp).line()


def cosignature_line(checkpoint_text: str, witness: SigningKey, timestamp: int) -> NoteSignature:
    message = cosignature_message(timestamp, checkpoint_text)
    sig = struct.pack(">Q", timestamp) + witness.sign(message)
    return NoteSignature(witness.name, cosigner_key_id(witness.name, witness.public.raw), sig)


def cosigner_vkey(key: PublicKey) -> str:
    """The type-0x04 verifier key text of a witness key."""
    return CosignatureVerifier(key).vkey()
