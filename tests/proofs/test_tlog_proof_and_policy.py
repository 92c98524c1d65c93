"""c2sp.org/tlog-proof text and c2sp.org/tlog-policy parsing."""

from __future__ import annotations

import base64
import hashlib

import pytest

from holedger.errors import UsageError, VerificationError
from holedger.ledger.keys import SigningKey
from holedger.ledger.note import (
    checkpoint_body,
    cosign_checkpoint,
    cosigner_vkey,
    sign_note,
    verify_checkpoint,
)
from holedger.ledger.proofs import MerkleTree, verify_inclusion
from holedger.ledger.tlog import TlogProof, parse_policy, parse_tlog_proof

H1 = hashlib.sha256(b"hash1").digest()
H2 = hashlib.sha256(b"hash2").digest()
B1, B2 = base64.b64encode(H1).decode(), base64.b64encode(H2).decode()


def test_marshal_matches_transparency_dev_known_outputs() -> None:
    # transparency-dev/formats proof/tlog_proof_test.go TestMarshal.
    assert TlogProof(5, (H1, H2), "test checkpoint\n").render() == (
        f"c2sp.org/tlog-proof@v1\nindex 5\n{B1}\n{B2}\n\ntest checkpoint\n"
    )
    extra = b"extra information"
    assert TlogProof(10, (H1,), "checkpoint data\n", extra).render() == (
        f"c2sp.org/tlog-proof@v1\nextra {base64.b64encode(extra).decode()}\nindex 10\n{B1}\n"
        "\ncheckpoint data\n"
    )
    assert TlogProof(0, (), "checkpoint\n").render() == (
        "c2sp.org/tlog-proof@v1\nindex 0\n\ncheckpoint\n"
    )


@pytest.mark.parametrize(
    "proof",
    [
        TlogProof(123, (H1, H2), "some checkpoint\n"),
        TlogProof(456, (H1,), "another checkpoint\n", b"some extra data"),
        TlogProof(789, (), "checkpoint\n"),
    ],
)
def test_round_trip(proof: TlogProof) -> None:
    assert parse_tlog_proof(proof.render()) == proof


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("wrong-header\nindex 0\n\ncheckpoint\n", "does not start"),
        ("c2sp.org/tlog-proof@v1\nextra !!notbase64!!\nindex 0\n\ncheckpoint\n", "extra"),
        ("c2sp.org/tlog-proof@v1\n\n\ncheckpoint\n", "no index"),
        ("c2sp.org/tlog-proof@v1\nindex notanumber\n\ncheckpoint\n", "index"),
        ("c2sp.org/tlog-proof@v1\nindex -5\n\ncheckpoint\n", "index"),
        ("c2sp.org/tlog-proof@v1\nindex 05\n\ncheckpoint\n", "index"),
        ("c2sp.org/tlog-proof@v1\nindex 0\n!!notbase64!!\n\ncheckpoint\n", "base64"),
        (
            "c2sp.org/tlog-proof@v1\nindex 0\n"
            + base64.b64encode(bytes(64)).decode()
            + "\n\ncheckpoint\n",
            "32 bytes",
        ),
        ("c2sp.org/tlog-proof@v1\nindex 0\n" + "a" * (65 * 1024) + "\n", "32 bytes"),
        ("c2sp.org/tlog-proof@v1\nindex 0\n" + (B1 + "\n") * 65 + "\ncheckpoint\n", "too many"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_malformed_proofs_are_refused(text: str, message: str) -> None:
    with pytest.raises(VerificationError, match=message):
        parse_tlog_proof(text)


def test_a_proof_binds_the_tree_size_through_the_signed_checkpoint() -> None:
    log = SigningKey.from_seed("example.com/log", b"\x01" * 32)
    tree = MerkleTree([hashlib.sha256(bytes([i])).digest() for i in range(4)])
    note = sign_note(checkpoint_body("example.com/log", 3, tree.root(3)), log)
    proof = parse_tlog_proof(TlogProof(0, tuple(tree.inclusion_proof(0, 3)), note).render())
    cp = verify_checkpoint(proof.checkpoint, [log.public]).checkpoint
    verify_inclusion(tree.leaves[0], proof.index, cp.size, list(proof.hashes), cp.root)
    # Leaf 0's path is the same for sizes 3 and 4; claiming size 4 means changing the
    # checkpoint text, which breaks the log signature.
    forged = proof.checkpoint.replace("\n3\n", "\n4\n", 1)
    with pytest.raises(VerificationError):
        verify_checkpoint(forged, [log.public])


def _keys() -> tuple[SigningKey, list[SigningKey]]:
    log = SigningKey.from_seed("example.com/log", b"\x01" * 32)
    return log, [SigningKey.from_seed(f"w{i}.example", bytes([i + 2]) * 32) for i in range(3)]


def test_policy_quorum_of_groups() -> None:
    log, (w1, w2, w3) = _keys()
    text = (
        "# operator plus one of two witnesses\n"
        f"log {log.public.vkey()}\n"
        f"witness W1 {cosigner_vkey(w1.public)}\n"
        f"  witness W2 {cosigner_vkey(w2.public)} https://w2.example/\n"
        f"witness W3\t{cosigner_vkey(w3.public)}\n"
        "group any-of-two any W2 W3\n"
        "group both all W1 any-of-two\n"
        "quorum both\n"
    )
    policy = parse_policy(text)
    assert policy.satisfied({"W1", "W2"}) and policy.satisfied({"W1", "W3"})
    assert not policy.satisfied({"W1"}) and not policy.satisfied({"W2", "W3"})
    note = sign_note(checkpoint_body("example.com/log", 1, bytes(32)), log)
    note = cosign_checkpoint(cosign_checkpoint(note, w1, 10), w3, 11)
    v = verify_checkpoint(note, policy.logs, witnesses=list(policy.witnesses.values()))
    assert policy.satisfied(policy.witness_names_for(v.cosigners))


@pytest.mark.parametrize(
    "text",
    [
        "",  # no quorum
        "quorum none\nquorum none\n",
        "quorum W1\n",
        "group g 1 W1\nquorum g\n",
        "witness none {w}\nquorum none\n",
        "witness W1 {w}\nwitness W2 {w}\nquorum W1\n",  # duplicate key
        "witness W1 {w}\ngroup g 2 W1\nquorum g\n",
        "witness W1 {w}\ngroup g 0 W1\nquorum g\n",
        "witness W1 {w}\ngroup g any W1 W1\nquorum g\n",
        "log not-a-key\nquorum none\n",
        "frobnicate\nquorum none\n",
    ],
)
def test_bad_policies_are_refused(text: str) -> None:
    _, (w1, *_) = _keys()
    with pytest.raises(UsageError):
        parse_policy(text.replace("{w}", cosigner_vkey(w1.public)))


def test_quorum_none_needs_no_witness() -> None:
    assert parse_policy("quorum none\n").satisfied(set())
