"""C2SP signed notes and tlog checkpoints (c2sp.org/signed-note, c2sp.org/tlog-checkpoint).

A checkpoint body is ``origin\\nsize\\nbase64(root)\\n``. A signed note is the body, one
blank line, then one signature line per signer: ``\\u2014 name base64(key_id || sig)\\n``
where the Ed25519 signature is over the body bytes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from holedger.errors import VerificationError
from holedger.ledger.keys import PublicKey, SigningKey

EM_DASH = "\u2014"
MAX_NOTE_BYTES = 1 << 20


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


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    """The tlog-checkpoint text of a tree (no extension lines)."""
    if not origin or "\n" in origin:
        raise ValueError("checkpoint origin must be one non-empty line")
    if len(root) != 32:
        raise ValueError("checkpoint root must be 32 bytes")
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def sign_note(text: str, key: SigningKey) -> str:
    """A signed note over ``text`` with one Ed25519 signature."""
    if not text.endswith("\n"):
        raise ValueError("note text must end with a newline")
    sig = key.sign(text.encode())
    return Note(text, (NoteSignature(key.name, key.key_id, sig),)).render()


def parse_note(note: str) -> Note:
    """Split a signed note into its text and signature lines (not verified)."""
    if len(note.encode()) > MAX_NOTE_BYTES:
        raise VerificationError("note is too large")
    split = note.rfind("\n\n")
    if split < 0:
        raise VerificationError("note has no blank line before its signatures")
    text, sig_block = note[: split + 1], note[split + 2 :]
    if not sig_block.endswith("\n"):
        raise VerificationError("note's signature block does not end with a newline")
    signatures = []
    for line in sig_block[:-1].split("\n"):
        if not line.startswith(EM_DASH + " "):
            raise VerificationError("malformed note signature line")
        parts = line[2:].split(" ")
        if len(parts) != 2:
            raise VerificationError("malformed note signature line")
        name, blob = parts
        try:
            raw = base64.b64decode(blob, validate=True)
        except binascii.Error as exc:
            raise VerificationError("note signature is not base64") from exc
        if len(raw) < 5:
            raise VerificationError("note signature is too short")
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    if not signatures:
        raise VerificationError("note has no signatures")
    return Note(text, tuple(signatures))


def verify_note(note: str, key: PublicKey) -> Note:
    """Check that ``key`` signed ``note``; signatures by other keys are ignored."""
    parsed = parse_note(note)
    for sig in parsed.signatures:
        if sig.name == key.name and sig.key_id == key.key_id:
            if key.verify(sig.signature, parsed.text.encode()):
                return parsed
            raise VerificationError(f"note signature by {key.name} does not verify")
    raise VerificationError(f"note carries no signature by {key.name} ({key.key_id_hex})")


@dataclass(frozen=True)
class CheckpointText:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


def parse_checkpoint(text: str) -> CheckpointText:
    """Parse the (already verified) checkpoint body."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise VerificationError("checkpoint body must have origin, size and root lines")
    origin, size_s, root_b64 = lines[0], lines[1], lines[2]
    if not origin:
        raise VerificationError("checkpoint origin is empty")
    if not size_s.isdigit() or (size_s != "0" and size_s.startswith("0")):
        raise VerificationError("checkpoint size is not a decimal number")
    try:
        root = base64.b64decode(root_b64, validate=True)
    except binascii.Error as exc:
        raise VerificationError("checkpoint root is not base64") from exc
    if len(root) != 32:
        raise VerificationError("checkpoint root is not 32 bytes")
    return CheckpointText(origin, int(size_s), root, tuple(lines[3:-1]))
