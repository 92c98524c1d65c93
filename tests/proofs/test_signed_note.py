"""C2SP signed notes, checkpoints and cosignatures against their published examples.

Known keys and signatures: the C2SP signed-note spec example, golang.org/x/mod
sumdb/note tests (PeterNeumann, EnochRoot), transparency-dev/formats note tests
(cosignature/v1 vkeys and a timestamped signature), the C2SP tlog-checkpoint example.
"""

from __future__ import annotations

import base64
import struct

import pytest

from holedger.errors import UsageError, VerificationError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.ledger.note import (
    CosignatureVerifier,
    Ed25519NoteVerifier,
    NoteSignature,
    checkpoint_body,
    cosign_checkpoint,
    cosignature_message,
    cosigner_key_id,
    cosigner_vkey,
    open_note,
    parse_checkpoint,
    parse_note,
    parse_vkey,
    sign_note,
    verify_checkpoint,
    verify_note,
)

C2SP_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
C2SP_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3"
    "mFXmRKuwHjG1Yu72IneyaQM=\n"
)
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKv"
    "qfqdngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOT"
    "GwnWLox33WWd1RvMc+QQ=\n"
)


def _v(vkey: str) -> Ed25519NoteVerifier:
    v = parse_vkey(vkey)
    assert isinstance(v, Ed25519NoteVerifier)
    return v


def test_c2sp_spec_example_verifies() -> None:
    opened = open_note(C2SP_NOTE, [_v(C2SP_VKEY)])
    assert opened.text == "This is an example message.\n"
    assert opened.verified_by == ("example.com/foo+530d903a",)


def test_c2sp_spec_example_with_one_changed_text_byte_fails() -> None:
    with pytest.raises(VerificationError, match="invalid signature"):
        open_note(C2SP_NOTE.replace("example message", "example massage"), [_v(C2SP_VKEY)])


def test_signing_reproduces_the_sumdb_note_signature_byte_for_byte() -> None:
    key = SigningKey.from_skey(PETER_SKEY)
    assert key.public.vkey() == PETER_VKEY
    assert sign_note(TEXT, key) == TEXT + "\n" + PETER_SIG


def test_one_of_two_signatures_verified_the_other_kept_unverified() -> None:
    opened = open_note(TEXT + "\n" + PETER_SIG + ENOCH_SIG, [_v(PETER_VKEY)])
    assert [s.name for s in opened.verified] == ["PeterNeumann"]
    assert [s.name for s in opened.unverified] == ["EnochRoot"]
    both = open_note(TEXT + "\n" + PETER_SIG + ENOCH_SIG, [_v(PETER_VKEY), _v(ENOCH_VKEY)])
    assert [s.name for s in both.verified] == ["PeterNeumann", "EnochRoot"]


def test_no_known_key_rejects_the_note() -> None:
    with pytest.raises(VerificationError, match="no verifiable signatures"):
        open_note(TEXT + "\n" + PETER_SIG + ENOCH_SIG, [])


def test_a_corrupt_signature_by_a_known_key_rejects_the_note() -> None:
    bad = PETER_SIG[:60] + "ABCD" + PETER_SIG[60:]
    with pytest.raises(VerificationError, match="invalid signature for key PeterNeumann"):
        open_note(TEXT + "\n" + bad, [_v(PETER_VKEY)])


def test_a_signature_matching_only_the_name_or_only_the_id_is_ignored() -> None:
    renamed = PETER_SIG.replace("PeterNeumann", "CarmenSandiego")
    with pytest.raises(VerificationError, match="no verifiable signatures"):
        open_note(TEXT + "\n" + renamed, [_v(PETER_VKEY)])
    wrong_id = PETER_SIG.replace("x08g", "xxxx")
    with pytest.raises(VerificationError, match="no verifiable signatures"):
        open_note(TEXT + "\n" + wrong_id, [_v(PETER_VKEY)])
    # Ignored, not fatal, when another signature verifies.
    opened = open_note(TEXT + "\n" + renamed + PETER_SIG, [_v(PETER_VKEY)])
    assert len(opened.unverified) == 1


def test_duplicate_signatures_are_counted_once() -> None:
    opened = open_note(
        TEXT + "\n" + PETER_SIG + PETER_SIG + ENOCH_SIG + ENOCH_SIG, [_v(PETER_VKEY)]
    )
    assert len(opened.verified) == 1 and len(opened.unverified) == 1


@pytest.mark.parametrize(
    "note",
    [
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        TEXT + "\n" + PETER_SIG.replace("PeterNeumann", "Bad Name"),
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        TEXT + "\n" + PETER_SIG * 101,
        TEXT + "\n" + "\u2014 PeterNeumann AAAA\n",
        TEXT + "\n" + "\u2014 Peter+Neumann " + PETER_SIG.split(" ")[2],
    ],
)
def test_malformed_notes_are_refused(note: str) -> None:
    with pytest.raises(VerificationError):
        open_note(note, [_v(PETER_VKEY)])


def test_invalid_utf8_note_bytes_are_refused() -> None:
    with pytest.raises(VerificationError, match="UTF-8"):
        parse_note(b"\xff" + (TEXT + "\n" + PETER_SIG).encode())


def test_note_text_may_contain_blank_lines_and_splits_at_the_last_one() -> None:
    key = SigningKey.from_skey(PETER_SKEY)
    text = "first\n\nsecond\n"
    note = sign_note(text, key)
    assert parse_note(note).text == text
    verify_note(note, key.public)


def test_sixteen_signatures_are_accepted() -> None:
    keys = [SigningKey.from_seed(f"k{i}", bytes([i]) * 32) for i in range(16)]
    note = "body\n\n" + "".join(sign_note("body\n", k).split("\n\n", 1)[1] for k in keys)
    opened = open_note(note, [Ed25519NoteVerifier(k.public) for k in keys])
    assert len(opened.verified) == 16


def test_vkey_manglings_are_refused() -> None:
    # As golang.org/x/mod sumdb/note TestNewVerifier: every proper substring and every
    # single-byte increment of a valid vkey must be refused.
    assert parse_vkey(PETER_VKEY).vkey() == PETER_VKEY
    b = PETER_VKEY.encode()
    for i in range(len(b) + 1):
        for j in range(i + 1, len(b) + 1):
            if i == 0 and j == len(b):
                continue
            with pytest.raises(UsageError):
                parse_vkey(b[i:j].decode())
    for i in range(len(b)):
        mangled = bytearray(b)
        mangled[i] += 1
        with pytest.raises(UsageError):
            parse_vkey(mangled.decode())


def test_both_vkey_parsers_take_one_spelling_only() -> None:
    # --trusted-key (PublicKey.from_vkey) and checkpoint verification (parse_vkey) accept
    # exactly what vkey() writes; any other spelling of the same key is refused by both,
    # with the same message
    key = SigningKey.from_seed("spelling", bytes(range(32))).public
    name, hex_id, blob = key.vkey().split("+", 2)
    assert hex_id != hex_id.upper()  # the id has letters, so upper case is another spelling
    assert PublicKey.from_vkey(key.vkey()) == key
    assert parse_vkey(key.vkey()).vkey() == key.vkey()
    for other in (
        f"{name}+{hex_id.upper()}+{blob}",
        f"{name}+{hex_id}+{blob}=",
        f"{name}+{hex_id}+{blob[:20]} {blob[20:]}",
        f"{name}+{hex_id}+{blob.replace('+', '-').replace('/', '_')}",
    ):
        with pytest.raises(UsageError) as from_vkey:
            PublicKey.from_vkey(other)
        with pytest.raises(UsageError) as note_vkey:
            parse_vkey(other)
        assert str(from_vkey.value) == str(note_vkey.value)


def test_a_vkey_whose_name_changed_case_says_so_not_that_the_key_is_wrong() -> None:
    # The key id hashes the name as written: a name retyped in upper case gives another
    # id. Both parsers say that, naming the name the id belongs to, for note keys (0x01)
    # and witness keys (0x04) alike; a name changed otherwise is named too.
    key = SigningKey.from_seed("holedger-operator", bytes(range(32))).public
    witness = cosigner_vkey(key)
    for vkey, parsers in (
        (key.vkey(), (PublicKey.from_vkey, parse_vkey)),
        (witness, (parse_vkey,)),
    ):
        name, rest = vkey.split("+", 1)
        for parse in parsers:
            with pytest.raises(UsageError) as upper:
                parse(f"{name.upper()}+{rest}")
            message = upper.value.one_line()
            assert "does not match its key" not in message
            assert f"is that of the name '{name}', not '{name.upper()}'" in message
            assert "computed over the name as written" in message and "(hint: " in message
            with pytest.raises(UsageError) as renamed:
                parse(f"someone-else+{rest}")
            message = renamed.value.one_line()
            assert "does not match the name 'someone-else' and the key" in message, message
            assert "(even its case)" in message


@pytest.mark.parametrize(
    "vkey",
    [
        # wrong key length with a matching key hash; unknown algorithm with a matching hash
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_sumdb_bad_vkeys_are_refused(vkey: str) -> None:
    with pytest.raises(UsageError):
        parse_vkey(vkey)


def test_native_cosignature_vkey_key_id_matches_the_0x04_derivation() -> None:
    # transparency-dev/formats note_cosigv1_test.go: a native type-0x04 verifier key.
    vkey = "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2"
    v = parse_vkey(vkey)
    assert isinstance(v, CosignatureVerifier)
    assert cosigner_key_id(v.name, v.key.raw).hex() == "da77ade7"
    assert v.vkey() == vkey


def test_cosignature_timestamp_layout_matches_transparency_dev_vector() -> None:
    # transparency-dev/formats TestCoSigV1Timestamp: key id, then u64be 1727964367.
    raw = base64.b64decode(
        "ZGhGuQAAAABm/qTPeyKXD+R2rzyQsxPiP8mXum7qq/iF0u4vanlqJyocWODBt97w9uL+8qT7S5gxEHWWOworDcFi"
        "EBYJXORmnFBOBA=="
    )
    assert len(raw) == 4 + 8 + 64
    assert struct.unpack(">Q", raw[4:12])[0] == 1727964367


def test_cosignature_message_is_header_time_and_body() -> None:
    body = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    assert cosignature_message(1679315147, body) == (
        b"cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\n"
        b"CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    )


WIT1_SKEY = "PRIVATE+KEY+Wit1+55ee4561+AeadRiG7XM4XiieCHzD8lxysXMwcViy5nYsoXURWGrlE"
WIT1_VKEY = "Wit1+55ee4561+AVhZSmQj9+SoL+p/nN0Hh76xXmF7QcHfytUrI1XfSClk"


def _checkpoint(size: int = 5) -> tuple[SigningKey, str]:
    log = SigningKey.from_skey(PETER_SKEY)
    return log, sign_note(checkpoint_body("example.com/log", size, bytes(range(32))), log)


def test_cosignature_round_trip_with_the_formats_witness_key() -> None:
    witness = SigningKey.from_skey(WIT1_SKEY)
    assert witness.public.vkey() == WIT1_VKEY
    log, note = _checkpoint()
    cosigned = cosign_checkpoint(note, witness, 1700000000)
    line = parse_note(cosigned).signatures[-1]
    assert line.key_id == cosigner_key_id("Wit1", witness.public.raw)
    assert line.key_id != witness.key_id  # 0x04 and 0x01 ids differ for the same key
    assert line.signature[:8] == struct.pack(">Q", 1700000000)
    # The Ed25519 signature is deterministic over the documented message.
    message = cosignature_message(1700000000, parse_note(note).text)
    assert line.signature[8:] == witness.sign(message)
    v = verify_checkpoint(cosigned, [log.public], witnesses=[witness.public])
    assert v.witnesses == ("Wit1",) and v.cosigned_at == (("Wit1", 1700000000),)
    assert parse_vkey(cosigner_vkey(witness.public)).key_id == line.key_id


def test_a_plain_note_key_cannot_stand_in_for_a_cosignature() -> None:
    witness = SigningKey.from_skey(WIT1_SKEY)
    log, note = _checkpoint()
    plain = (
        note
        + NoteSignature(
            witness.name, witness.key_id, witness.sign(parse_note(note).text.encode())
        ).line()
    )
    v = verify_checkpoint(plain, [log.public], witnesses=[witness.public])
    assert v.witnesses == ()


def test_a_tampered_cosignature_rejects_the_checkpoint() -> None:
    witness = SigningKey.from_skey(WIT1_SKEY)
    log, note = _checkpoint()
    cosigned = cosign_checkpoint(note, witness, 1700000000)
    sig = parse_note(cosigned).signatures[-1]
    forged_ts = NoteSignature(
        sig.name, sig.key_id, struct.pack(">Q", 1700000001) + sig.signature[8:]
    )
    with pytest.raises(VerificationError, match="invalid signature for key Wit1"):
        verify_checkpoint(note + forged_ts.line(), [log.public], witnesses=[witness.public])


def test_checkpoint_needs_the_log_key_not_only_a_witness() -> None:
    witness = SigningKey.from_skey(WIT1_SKEY)
    _, note = _checkpoint()
    cosigned = cosign_checkpoint(note, witness, 1)
    other = SigningKey.from_seed("example.com/log", b"\x07" * 32)
    with pytest.raises(VerificationError, match="trusted log key"):
        verify_checkpoint(cosigned, [other.public], witnesses=[witness.public])


def test_c2sp_checkpoint_example_body_parses() -> None:
    cp = parse_checkpoint(
        "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    )
    assert (cp.origin, cp.size) == ("example.com/behind-the-sofa", 20852163)
    assert cp.body().endswith("2I=\n")
    sumdb = parse_checkpoint(
        "go.sum database tree\n123456789012\nTszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=\n"
    )
    assert sumdb.size == 123456789012


@pytest.mark.parametrize(
    "body",
    [
        "o\n",
        "o\n01\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "o\n-1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "o\n1\nAAAA\n",
        "\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        "o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n",
        "o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "o\n\u0661\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
    ],
)
def test_malformed_checkpoint_bodies_are_refused(body: str) -> None:
    with pytest.raises(VerificationError):
        parse_checkpoint(body)


def test_public_key_vkey_round_trip_through_note_verifier() -> None:
    key = PublicKey.from_vkey(ENOCH_VKEY)
    assert Ed25519NoteVerifier(key).vkey() == ENOCH_VKEY
