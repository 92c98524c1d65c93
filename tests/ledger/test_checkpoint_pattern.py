"""The checkpoint pattern accepts nothing the reference path refuses, and reads the same values.

``fastpath.checkpoint_pattern`` lets replay's chunk path read a Checkpoint record, its
envelope, payload and signed note, with one regular expression instead of parsing the
record, validating its payload and parsing its note. That is sound only if every record
it matches is one ``parse_record`` accepts, with a valid Checkpoint payload, whose note
``parse_note`` and ``parse_checkpoint`` read to the very text, size, root and one
signature line the pattern's groups give. These tests check that agreement on the
checkpoints holedger writes, on near misses made by the key holder (re-signed, so that
only the pattern can refuse them) and on random byte mutations.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from holedger.errors import SchemaError, VerificationError
from holedger.ledger.fastpath import checkpoint_pattern
from holedger.ledger.keys import SigningKey
from holedger.ledger.note import (
    checkpoint_body,
    cosign_checkpoint,
    parse_checkpoint,
    parse_note,
    sign_note,
)
from holedger.ledger.records import parse_record_strict, sign_envelope
from holedger.ledger.store import Ledger
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import Checkpoint
from ledger.attacker import mutate
from ledger.recorded_run import record_run

KEY = SigningKey.from_seed("holedger-operator", bytes(range(32)))
RUN = "5cc5c15a-c7bd-4381-be43-6f071cd22836"
ORIGIN = f"holedger/run/{RUN}"
FOUND = checkpoint_pattern(RUN, ORIGIN, KEY.name)
assert FOUND is not None
PATTERN = FOUND
ROOT = bytes(range(100, 132))


def record(payload: dict[str, Any], **changes: Any) -> bytes:
    env = {
        "key_id": KEY.key_id_hex,
        "payload": payload,
        "prev_hash": "ab" * 32,
        "role": "server",
        "run_id": RUN,
        "schema_version": 1,
        "seq": 64,
        "time": "2026-12-01T02:27:05.768341Z",
        "type": "Checkpoint",
    }
    env.update(changes)
    return sign_envelope(KEY, env, canonical_json(env)).raw


def checkpoint(size: int = 64, root: bytes = ROOT, note: str | None = None) -> dict[str, Any]:
    if note is None:
        note = sign_note(checkpoint_body(ORIGIN, size, root), KEY)
    return {"note": note, "root": root.hex(), "size": size}


def agree(raw: bytes) -> bool:
    """Whether the pattern matches; when it does, the reference path must accept the
    record and its payload, and read the values the groups give."""
    match = PATTERN.fullmatch(raw)
    if match is None:
        return False
    try:
        rec = parse_record_strict(raw)
        payload = rec.typed_payload()
        assert isinstance(payload, Checkpoint)
        note = parse_note(payload.note)
        body = parse_checkpoint(note.text)
    except (VerificationError, SchemaError) as exc:
        raise AssertionError(f"matched a record the reference refuses ({exc}): {raw!r}") from exc
    assert match.group("_key_id").decode() == rec.key_id
    assert match.group("_prev_hash").decode() == rec.prev_hash
    assert match.group("_role") == b"server" == rec.role.encode()
    assert match.group("_seq") == str(rec.seq).encode()
    assert match.group("_type") == b"Checkpoint" == rec.type.encode()
    start, end = match.span("_sig")
    assert base64.b64decode(raw[start:end]) == rec.signature
    assert raw[: start - 8] + raw[end + 1 :] == rec.signed
    assert match.group("_size") == str(payload.size).encode()
    assert match.group("_root").decode() == payload.root
    assert match.group("_text").replace(b"\\n", b"\n") == note.text.encode()
    assert body.origin == ORIGIN and body.extensions == ()
    assert match.group("_text_size") == str(body.size).encode()
    assert base64.b64decode(match.group("_text_root")) == body.root
    (line,) = note.signatures
    assert line.name == KEY.name
    assert base64.b64decode(match.group("_note_sig")) == line.key_id + line.signature
    return True


def test_what_holedger_writes_is_matched(tmp_path: Any) -> None:
    """Every checkpoint the ledger writes goes the pattern's way (else replay slows down)."""
    key = SigningKey.generate("holedger-operator")
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}", key, checkpoint_interval=4)
    try:
        run_id = record_run(ledger, rounds=2)
        raws = [raw for _, raw in ledger.raw_records(run_id)]
    finally:
        ledger.close()
    found = checkpoint_pattern(run_id, f"holedger/run/{run_id}", key.name)
    assert found is not None
    written = [raw for raw in raws if parse_record_strict(raw).type == "Checkpoint"]
    assert len(written) >= 3
    assert all(found.fullmatch(raw) for raw in written)
    assert not any(found.fullmatch(raw) for raw in raws if raw not in written)


def test_a_checkpoint_as_written_agrees() -> None:
    assert agree(record(checkpoint()))
    assert agree(record(checkpoint(size=0, root=bytes(32)), seq=0))


def _with_extension(size: int, root: bytes) -> str:
    return sign_note(checkpoint_body(ORIGIN, size, root) + "an extension line\n", KEY)


# Each is signed by the key holder: only the pattern can refuse it, and it must.
NEAR_MISSES: dict[str, bytes] = {
    "a cosignature line too": record(
        checkpoint(note=cosign_checkpoint(checkpoint()["note"], SigningKey.generate("w"), 5))
    ),
    "an extension line": record(checkpoint(note=_with_extension(64, ROOT))),
    "signed under another key name": record(
        checkpoint(
            note=sign_note(
                checkpoint_body(ORIGIN, 64, ROOT), SigningKey.from_seed("other", bytes(32))
            )
        )
    ),
    "another origin": record(
        checkpoint(note=sign_note(checkpoint_body(ORIGIN + "x", 64, ROOT), KEY))
    ),
    "by the gateway role": record(checkpoint(), role="gateway"),
    "another run": record(checkpoint(), run_id=RUN.replace("5", "6")),
    "a payload member extra": record(dict(checkpoint(), witness="w")),
    "not a note": record(checkpoint(note="not a note\n")),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_not_matched(name: str) -> None:
    assert not agree(NEAR_MISSES[name]), name


def _swap(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw, old
    return raw.replace(old, new, 1)


_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _padding_bit_set(encoded: bytes) -> bytes:
    """The same bytes in base64 with a padding bit set: decoders accept it, no encoder
    writes it."""
    last = encoded.rstrip(b"=")[-1]
    index = _B64.index(last)
    assert index % 4 == 0  # two bytes in the last group: four padding bits, all zero
    other = encoded[: len(encoded.rstrip(b"=")) - 1] + _B64[index + 1 : index + 2] + b"="
    assert base64.b64decode(other) == base64.b64decode(encoded)
    return other


def test_non_canonical_base64_is_not_matched() -> None:
    raw = record(checkpoint())
    root_b64 = base64.b64encode(ROOT)
    assert not agree(_swap(raw, root_b64, _padding_bit_set(root_b64)))
    line = parse_note(checkpoint()["note"]).signatures[0]
    sig_b64 = base64.b64encode(line.key_id + line.signature)
    assert not agree(_swap(raw, sig_b64, _padding_bit_set(sig_b64)))


def test_names_it_cannot_spell_get_no_pattern() -> None:
    assert checkpoint_pattern(RUN, ORIGIN, 'a"quote') is None
    assert checkpoint_pattern(RUN, ORIGIN, "a\\b") is None
    assert checkpoint_pattern(RUN, "two\nlines", KEY.name) is None
    assert checkpoint_pattern("not-a-run", ORIGIN, KEY.name) is None


@pytest.mark.parametrize("seed", range(3))
def test_random_mutations_never_widen_acceptance(seed: int) -> None:
    rng = random.Random(seed)
    bases = [record(checkpoint()), record(checkpoint(size=7), seq=7)]
    alphabet = b'{}[]",:0123456789.eE-+ \\/abnAQgw=\x00\xe2\x80\x94'
    accepted = 0
    for _ in range(1500):
        accepted += agree(mutate(rng, rng.choice(bases), alphabet))
    assert accepted < 1500  # most mutations break the record; agree() checked the rest


def test_a_run_replays_without_parsing_its_checkpoints(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an intact run, the chunk check parses no checkpoint the reference way."""
    from holedger.replay import chunks
    from holedger.replay.runs import replay_run

    key = SigningKey.generate("holedger-operator")
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}", key, checkpoint_interval=4)
    try:
        run_id = record_run(ledger, rounds=2)
        parsed: list[str] = []
        reference = chunks._parsed

        def counting(run: Any, raw: bytes) -> Any:
            parsed.append(parse_record_strict(raw).type)
            return reference(run, raw)

        monkeypatch.setattr(chunks, "_parsed", counting)
        report = replay_run(ledger, run_id, checks=())
    finally:
        ledger.close()
    assert report.verified
    assert "RunClosed" in parsed  # the counting is real
    assert "Checkpoint" not in parsed


def test_a_non_ascii_signature_blob_is_refused_not_a_crash() -> None:
    """A note whose signature line holds a non-ASCII character is a malformed note."""
    from holedger.replay.runs import verify_records

    note = checkpoint()["note"]
    text, line = note.rsplit("\u2014 ", 1)
    bad = text + "\u2014 " + line[:-3] + "\u00e9=\n"
    with pytest.raises(VerificationError, match="base64"):
        parse_note(bad)
    raw = record(checkpoint(note=bad))
    assert not agree(raw)
    report = verify_records(RUN, [raw], None, checks=())  # type: ignore[arg-type]
    assert not report.verified
