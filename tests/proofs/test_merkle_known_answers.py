"""Known answers for RFC 6962 hashing and proofs.

Values are from RFC 6962's reference test tree as published in transparency-dev/merkle
(testonly/constants.go: leaf inputs, node hashes, roots of sizes 0..8;
rfc6962/rfc6962_test.go: single-hash answers).
"""

from __future__ import annotations

import pytest

from holedger.ledger.merkle import EMPTY_ROOT, MerkleFrontier, leaf_hash, node_hash
from holedger.ledger.proofs import MerkleTree, verify_consistency, verify_inclusion

LEAF_INPUTS = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
LEAF_HASHES = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
    "0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7",
    "07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7",
    "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    "4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658",
    "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
    "46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1",
]
H = bytes.fromhex


def test_empty_tree_root_is_sha256_of_nothing() -> None:
    assert EMPTY_ROOT.hex() == ROOTS[0]
    assert MerkleTree([]).root().hex() == ROOTS[0]


def test_leaf_hash_of_empty_input() -> None:
    assert leaf_hash(b"").hex() == LEAF_HASHES[0]


def test_leaf_hash_of_l123456() -> None:
    assert leaf_hash(b"L123456").hex() == (
        "395aa064aa4c29f7010acfe3f25db9485bbd4b91897b6ad7ad547639252b4d56"
    )


def test_node_hash_of_n123_n456() -> None:
    assert node_hash(b"N123", b"N456").hex() == (
        "aa217fe888e47007fa15edab33c2b492a722cb106c64667fc2b044444de66bbb"
    )


@pytest.mark.parametrize("index", range(8))
def test_reference_leaf_hashes(index: int) -> None:
    assert leaf_hash(LEAF_INPUTS[index]).hex() == LEAF_HASHES[index]


@pytest.mark.parametrize("size", range(9))
def test_reference_roots_for_sizes_0_to_8(size: int) -> None:
    tree = MerkleTree.from_entries(LEAF_INPUTS)
    assert tree.root(size).hex() == ROOTS[size]
    frontier = MerkleFrontier()
    for h in tree.leaves[:size]:
        frontier.append(h)
    assert frontier.root().hex() == ROOTS[size]


def test_inclusion_proof_of_leaf_0_in_the_8_leaf_tree() -> None:
    # transparency-dev testdata inclusion/1/happy-path.json, hashes in hex.
    proof = MerkleTree.from_entries(LEAF_INPUTS).inclusion_proof(0, 8)
    assert [p.hex() for p in proof] == [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]
    verify_inclusion(H(LEAF_HASHES[0]), 0, 8, proof, H(ROOTS[8]))


def test_inclusion_proof_of_leaf_6_in_the_7_leaf_tree() -> None:
    # RFC 6962 section 2.1.3: the audit path for d6 in the 7-leaf tree is [k, g] where
    # k = MTH(d4, d5) and g = MTH(d0..d3).
    proof = MerkleTree.from_entries(LEAF_INPUTS).inclusion_proof(6, 7)
    assert [p.hex() for p in proof] == [
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ]


def test_consistency_proof_from_size_1_to_8() -> None:
    # transparency-dev testdata consistency/1/happy-path.json: the same three hashes.
    proof = MerkleTree.from_entries(LEAF_INPUTS).consistency_proof(1, 8)
    assert [p.hex() for p in proof] == [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]
    verify_consistency(1, 8, H(ROOTS[1]), H(ROOTS[8]), proof)


def test_consistency_proof_from_size_3_to_7_matches_rfc_6962_example() -> None:
    # RFC 6962 section 2.1.3: PROOF(3, D[7]) = [c, d, g, l]; c, d are leaves 2 and 3,
    # g = MTH(d0, d1), l = MTH(d4..d6).
    tree = MerkleTree.from_entries(LEAF_INPUTS)
    proof = tree.consistency_proof(3, 7)
    assert proof == [
        H(LEAF_HASHES[2]),
        H(LEAF_HASHES[3]),
        H("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        tree.subtree(4, 7),
    ]
    verify_consistency(3, 7, H(ROOTS[3]), H(ROOTS[7]), proof)


def test_consistency_proof_from_size_4_to_7_is_rfc_6962_example() -> None:
    # RFC 6962 section 2.1.3: PROOF(4, D[7]) = [l], with l = MTH(d4..d6).
    tree = MerkleTree.from_entries(LEAF_INPUTS)
    assert tree.consistency_proof(4, 7) == [tree.subtree(4, 7)]
    verify_consistency(4, 7, H(ROOTS[4]), H(ROOTS[7]), [tree.subtree(4, 7)])
