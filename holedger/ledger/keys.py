"""Ed25519 keys with C2SP signed-note names and key ids.

A key id is the first 4 bytes of ``SHA-256(name || 0x0A || 0x01 || public_key)``
(C2SP signed-note, algorithm byte 0x01 = Ed25519), written as 8 lower-case hex digits in
events and as raw bytes inside note signature lines. A verifier key ("vkey") is the text
``name+hex(key_id)+base64(0x01 || public_key)``.

Private keys live in one file each, mode 0600: the C2SP signer-key text
``PRIVATE+KEY+name+hex(key_id)+base64(0x01 || seed)``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from holedger.errors import ConfigError, NotFoundError, StorageError, UsageError
from holedger.ledger.edwards import public_key_problem
from holedger.schemas.canonical import b64decode_strict

NO_HOME_HINT = "run 'holedger init' to make it, or point --home or HOLEDGER_HOME at one"

ALG_ED25519 = 0x01
VKEY_HINT = "expected name+keyid+base64 as printed by 'holedger keys show'"


def key_id_bytes(name: str, public_key: bytes, alg: int = ALG_ED25519) -> bytes:
    """The C2SP signed-note key id (4 bytes): SHA-256(name || 0x0A || alg || key)[:4].

    ``alg`` is 0x01 for an Ed25519 note key, 0x04 for a tlog-cosignature v1 witness key.
    """
    if len(public_key) != 32:
        raise UsageError("an Ed25519 public key is 32 bytes")
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public_key).digest()[:4]


def key_id_mismatch(name: str, hex_id: str, public_key: bytes, alg: int) -> UsageError:
    """The error for a verifier key whose id is not the one its name and key give. The id
    is a hash of the name as written and the key, so a name retyped in another case (or
    changed at all) is the usual cause, not a wrong key: say which when we can tell."""
    hint = "copy the verifier key whole, exactly as it was printed"
    for other in dict.fromkeys((name.lower(), name.upper())):
        if other != name and key_id_bytes(other, public_key, alg).hex() == hex_id:
            return UsageError(
                f"verifier key id {hex_id} is that of the name {other!r}, not {name!r}: the id "
                "is computed over the name as written, so a change of case changes it",
                hint=hint,
            )
    return UsageError(
        f"verifier key id {hex_id} does not match the name {name!r} and the key given with "
        "it: the id is computed over both as written, so a changed name (even its case) "
        "or key gives another id",
        hint=hint,
    )


def check_key_name(name: str) -> str:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise UsageError(
            f"bad key name {name!r}", hint="a key name is non-empty, with no spaces and no '+'"
        )
    return name


@dataclass(frozen=True)
class PublicKey:
    """A named Ed25519 verification key."""

    name: str
    raw: bytes

    @cached_property
    def key_id(self) -> bytes:
        return key_id_bytes(self.name, self.raw)

    @cached_property
    def key_id_hex(self) -> str:
        return self.key_id.hex()

    @property
    def b64(self) -> str:
        return base64.b64encode(self.raw).decode()

    @classmethod
    def declared(cls, name: str, public_key_b64: str) -> PublicKey:
        """The key a RunOpened declares (``name``, base64 ``public_key``); malformed base64
        gives an empty key, which every check refuses."""
        return cls(name, b64decode_strict(public_key_b64) or b"")

    def vkey(self) -> str:
        """The C2SP verifier key text."""
        blob = base64.b64encode(bytes([ALG_ED25519]) + self.raw).decode()
        return f"{self.name}+{self.key_id_hex}+{blob}"

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self._verifier.verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    @cached_property
    def _verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)

    def verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)

    @classmethod
    def from_vkey(cls, text: str) -> PublicKey:
        """Parse ``name+hexid+base64(0x01||key)``, checking the id against the key."""
        name, hex_id, raw, _ = vkey_parts(text)
        if len(raw) == 33 and raw[0] == 0x04:
            raise UsageError(
                "this is a witness cosignature key (type 0x04), not a log verifier key",
                hint="give the operator's verifier key here ('holedger keys show'); a witness "
                "key goes where one is asked for, such as 'verify --witness'",
            )
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise UsageError("verifier key is not an Ed25519 key", hint=VKEY_HINT)
        key = cls(check_key_name(name), raw[1:])
        if key.key_id_hex != hex_id:
            raise key_id_mismatch(key.name, hex_id, key.raw, ALG_ED25519)
        return key.require_sound()

    def require_sound(self) -> PublicKey:
        """This key, or UsageError when it is of small order or not a canonical point
        (such a key would make forged signatures verify)."""
        problem = public_key_problem(self.raw)
        if problem is not None:
            raise UsageError(f"verifier key {self.name} is unusable: {problem}")
        return self


class SigningKey:
    """A named Ed25519 private key."""

    def __init__(self, name: str, private: Ed25519PrivateKey) -> None:
        self.name = check_key_name(name)
        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = PublicKey(self.name, raw)

    @classmethod
    def generate(cls, name: str) -> SigningKey:
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> SigningKey:
        return cls(name, Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def key_id(self) -> bytes:
        return self.public.key_id

    @property
    def key_id_hex(self) -> str:
        return self.public.key_id_hex

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def seed(self) -> bytes:
        return self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def skey(self) -> str:
        """The C2SP signer key text (keep it secret)."""
        blob = base64.b64encode(bytes([ALG_ED25519]) + self.seed()).decode()
        return f"PRIVATE+KEY+{self.name}+{self.key_id_hex}+{blob}"

    @classmethod
    def from_skey(cls, text: str) -> SigningKey:
        parts = text.strip().split("+", 4)  # the base64 part may itself hold '+'
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise ConfigError("not a holedger private key file", hint="run 'holedger init'")
        _, _, name, hex_id, blob = parts
        raw = b64decode_strict(blob)
        if raw is None:
            raise ConfigError("private key file has bad base64")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise ConfigError("private key file is not an Ed25519 key")
        key = cls.from_seed(name, raw[1:])
        if key.key_id_hex != hex_id.lower():
            raise ConfigError("private key file's key id does not match its key")
        return key

    def save(self, path: Path) -> None:
        """Write the key file with mode 0600, refusing to overwrite an existing one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError as exc:
            raise ConfigError(f"key file {path} exists", hint="keys are never overwritten") from exc
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(self.skey() + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            # No half-written key left behind: it would refuse to load, and hide the cause.
            path.unlink(missing_ok=True)
            raise StorageError(
                f"cannot write the key file {path}: {exc.strerror or exc}",
                hint="free space on its disk (or fix its permissions), then run it again",
            ) from exc
        os.chmod(path, 0o600)

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        try:
            text = path.read_text()
        except FileNotFoundError as exc:
            home = path.parent.parent
            if not home.is_dir():
                raise ConfigError(f"no holedger home at {home}", hint=NO_HOME_HINT) from exc
            raise ConfigError(f"no key file at {path}", hint="run 'holedger init'") from exc
        mode = path.stat().st_mode & 0o777
        if not text.strip().startswith("PRIVATE+KEY+"):
            # Checked before the mode: a verifier key file is meant to be readable.
            raise ConfigError(
                f"{path} is not a holedger private key file",
                hint="give the private (signing) key file; a verifier key only verifies",
            )
        if mode & 0o077:
            raise ConfigError(
                f"key file {path} is readable by others (mode {mode:o})",
                hint=f"chmod 600 {path}",
            )
        return cls.from_skey(text)


def vkey_parts(text: str, hint: str = VKEY_HINT) -> tuple[str, str, bytes, str]:
    """The name, hex key id, decoded key bytes and base64 text of a verifier key
    ``name+hexid+base64(type || key)``; UsageError when it has not that shape. The form is
    exact, as ``vkey()`` writes it (8 lower-case hex digits, canonical base64), so a key
    has one spelling wherever it is given."""
    parts = text.strip().split("+", 2)  # the base64 part may itself hold '+'
    if len(parts) != 3:
        raise UsageError(f"not a verifier key: {text.strip()[:60]!r}", hint=hint)
    name, hex_id, blob = parts
    if len(hex_id) != 8 or any(c not in "0123456789abcdef" for c in hex_id):
        raise UsageError("verifier key id is not 8 lower-case hex digits", hint=hint)
    raw = b64decode_strict(blob)
    if raw is None:
        raise UsageError("verifier key has bad base64", hint=hint)
    if base64.b64encode(raw).decode() != blob:
        raise UsageError("verifier key base64 is not canonical", hint=hint)
    return name, hex_id, raw, blob


def vkey_texts(values: Sequence[str], *, what: str, file_word: str, hint: str) -> list[str]:
    """The vkey texts of command-line values: each a vkey (it holds a ``+``), or a file of
    them (one per line; blank lines and ``#`` comments skipped). A file holding none is
    refused; a value that is neither is a one-line error naming ``what`` it should be."""
    texts: list[str] = []
    for value in values:
        path = Path(value)
        if value and path.is_file():
            try:
                lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read {file_word} {value}: {exc}", hint=hint) from exc
            found = [ln for ln in lines if ln and not ln.startswith("#")]
            if not found:
                raise UsageError(f"no {what} in {file_word} {value}", hint=hint)
            texts.extend(found)
        elif "+" in value:
            texts.append(value)
        elif value and not path.exists():  # most likely a mistyped file name
            raise NotFoundError(f"no {file_word} at {value} (and it is not a {what})", hint=hint)
        else:
            raise UsageError(f"not a {what} or a {file_word}: {value!r}", hint=hint)
    return texts


def load_trusted_keys(values: list[str]) -> list[PublicKey]:
    """Keys given on the command line: a vkey text, or a keyring file of vkeys (one per
    line; blank lines and ``#`` comments skipped). A keyring holding no key is refused:
    pinning nothing would silently trust whatever keys the log declares."""
    hint = "give a vkey as printed by 'holedger keys show', or a file of them"
    texts = vkey_texts(values, what="verifier key", file_word="keyring file", hint=hint)
    return [PublicKey.from_vkey(text) for text in texts]
