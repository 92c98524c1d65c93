"""C2SP texts around checkpoints (at c2sp.org; signed notes and checkpoints are note.py's):

* ``tlog-proof`` v1: ``c2sp.org/tlog-proof@v1``, optional ``extra <b64>``,
  ``index <n>``, proof hashes one per line, an empty line, the checkpoint verbatim.
* ``tlog-policy``: ``log``, ``witness``, ``group`` and ``quorum`` lines (a subset:
  URLs are accepted and ignored): which logs and witnesses a verifier trusts, and the
  quorum of witness cosignatures it requires.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field

from holedger.errors import UsageError, VerificationError
from holedger.ledger.keys import PublicKey
from holedger.ledger.note import (
    MAX_NOTE_BYTES,
    Ed25519NoteVerifier,
    cosigner_key_id,
    parse_vkey,
)
from holedger.schemas.canonical import b64decode_strict

# ---------------------------------------------------------------------- tlog proofs

TLOG_PROOF_HEADER = "c2sp.org/tlog-proof@v1"


@dataclass(frozen=True)
class TlogProof:
    """A c2sp.org/tlog-proof@v1: an inclusion proof plus the checkpoint it is against."""

    index: int
    hashes: tuple[bytes, ...]
    checkpoint: str
    extra: bytes | None = None

    def render(self) -> str:
        out = [TLOG_PROOF_HEADER + "\n"]
        if self.extra is not None:
            out.append(f"extra {base64.b64encode(self.extra).decode()}\n")
        out.append(f"index {self.index}\n")
        out.extend(base64.b64encode(h).decode() + "\n" for h in self.hashes)
        out.append("\n")
        out.append(self.checkpoint)
        return "".join(out)


MAX_PROOF_TEXT = 4 * MAX_NOTE_BYTES


def parse_tlog_proof(text: str | bytes) -> TlogProof:
    """Parse the tlog-proof text format (nothing is verified here)."""
    if isinstance(text, bytes):
        if len(text) > MAX_PROOF_TEXT:
            raise VerificationError("tlog proof is too large")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VerificationError("tlog proof is not UTF-8") from exc
    if len(text) > MAX_PROOF_TEXT:
        raise VerificationError("tlog proof is too large")
    header, sep, rest = text.partition("\n")
    if not sep or header != TLOG_PROOF_HEADER:
        raise VerificationError(f"tlog proof does not start with {TLOG_PROOF_HEADER}")
    extra: bytes | None = None
    line, sep, rest = rest.partition("\n")
    if line.startswith("extra "):
        extra = b64decode_strict(line[6:])
        if extra is None:
            raise VerificationError("tlog proof extra data is not base64")
        line, sep, rest = rest.partition("\n")
    if not sep or not line.startswith("index "):
        raise VerificationError("tlog proof has no index line")
    index_s = line[6:]
    if not index_s.isascii() or not index_s.isdigit() or (index_s != "0" and index_s[0] == "0"):
        raise VerificationError("tlog proof index is not a decimal number")
    if len(index_s) > 20 or int(index_s) >= 1 << 64:
        raise VerificationError("tlog proof index is out of range")
    hashes: list[bytes] = []
    while True:
        line, sep, rest = rest.partition("\n")
        if not sep:
            raise VerificationError("tlog proof has no empty line before its checkpoint")
        if line == "":
            break
        if len(hashes) >= 64:
            raise VerificationError("tlog proof has too many hashes")
        h = b64decode_strict(line)
        if h is None:
            raise VerificationError("tlog proof hash is not base64")
        if len(h) != 32:
            raise VerificationError("tlog proof hash length is not 32 bytes")
        hashes.append(h)
    return TlogProof(int(index_s), tuple(hashes), rest, extra)


# -------------------------------------------------------------------- tlog policy


@dataclass(frozen=True)
class WitnessGroup:
    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass
class TlogPolicy:
    """A c2sp.org/tlog-policy: trusted logs, witnesses, groups and the quorum."""

    logs: list[PublicKey] = field(default_factory=list)
    witnesses: dict[str, PublicKey] = field(default_factory=dict)
    groups: dict[str, WitnessGroup] = field(default_factory=dict)
    quorum: str = "none"

    def satisfied(self, cosigned_by: Iterable[str]) -> bool:
        """Whether the witnesses (by policy name) that cosigned meet the quorum."""
        signed = set(cosigned_by)
        return self._holds(self.quorum, signed)

    def _holds(self, name: str, signed: set[str]) -> bool:
        if name == "none":
            return True
        if name in self.witnesses:
            return name in signed
        group = self.groups[name]
        return sum(self._holds(m, signed) for m in group.members) >= group.threshold

    def witness_names_for(self, cosigners: Iterable[tuple[str, bytes]]) -> set[str]:
        """Policy names of the witnesses among ``cosigners`` ((key name, cosignature key
        id) pairs, :attr:`VerifiedCheckpoint.cosigners`): matched by name and key id, so
        a cosignature by one key never counts for another key of the same name."""
        wanted = set(cosigners)
        return {
            n
            for n, k in self.witnesses.items()
            if (k.name, cosigner_key_id(k.name, k.raw)) in wanted
        }


def parse_policy(text: str) -> TlogPolicy:
    """Parse a tlog-policy file (log, witness, group, quorum lines; URLs ignored)."""
    policy = TlogPolicy()
    quorum: str | None = None
    names: set[str] = set()
    raw_keys: set[bytes] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t")
        if not line or line.startswith("#"):
            continue
        words = line.replace("\t", " ").split()
        where = f"policy line {number}"
        kind = words[0]
        if kind == "log" and len(words) in (2, 3):
            verifier = parse_vkey(words[1])
            if not isinstance(verifier, Ed25519NoteVerifier):
                raise UsageError(f"{where}: a log key must be an Ed25519 (0x01) vkey")
            _no_duplicate_key(verifier.key.raw, raw_keys, where)
            policy.logs.append(verifier.key)
        elif kind == "witness" and len(words) in (3, 4):
            name = words[1]
            _new_name(name, names, where)
            verifier = parse_vkey(words[2])
            _no_duplicate_key(verifier.key.raw, raw_keys, where)
            policy.witnesses[name] = verifier.key
        elif kind == "group" and len(words) >= 4:
            name, k_s, members = words[1], words[2], tuple(words[3:])
            _new_name(name, names, where)
            if len(set(members)) != len(members):
                raise UsageError(f"{where}: a group lists a member twice")
            for m in members:
                if m not in names or m == name:
                    raise UsageError(f"{where}: group member {m!r} is not defined above")
            if k_s == "all":
                k = len(members)
            elif k_s == "any":
                k = 1
            elif k_s.isdigit() and 1 <= int(k_s) <= len(members):
                k = int(k_s)
            else:
                raise UsageError(f"{where}: group threshold must be all, any or 1..n")
            policy.groups[name] = WitnessGroup(name, k, members)
        elif kind == "quorum" and len(words) == 2:
            if quorum is not None:
                raise UsageError(f"{where}: a policy has exactly one quorum line")
            if words[1] != "none" and words[1] not in names:
                raise UsageError(f"{where}: quorum {words[1]!r} is not defined above")
            quorum = words[1]
        else:
            raise UsageError(
                f"{where}: cannot parse {line[:100]!r}",
                hint="lines are 'log VKEY [URL]', 'witness NAME VKEY [URL]', "
                "'group NAME all|any|K MEMBER...' and 'quorum NAME|none'",
            )
    if quorum is None:
        raise UsageError("policy has no quorum line", hint="add 'quorum none' or a group")
    policy.quorum = quorum
    return policy


def _new_name(name: str, names: set[str], where: str) -> None:
    if name == "none" or name in names:
        raise UsageError(f"{where}: name {name!r} is reserved or already defined")
    names.add(name)


def _no_duplicate_key(raw: bytes, seen: set[bytes], where: str) -> None:
    if raw in seen:
        raise UsageError(f"{where}: the same public key is listed twice")
    seen.add(raw)
