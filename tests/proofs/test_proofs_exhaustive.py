"""Generated proofs verify for every tree size up to 300; every mutation of them fails."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holedger.errors import UsageError, VerificationError
from holedger.ledger.merkle import root_from_leaf_hashes
from holedger.ledger.proofs import (
    MerkleTree,
    consistency_proof,
    inclusion_proof,
    verify_consistency,
    verify_inclusion,
)

MAX_SIZE = 300
TREE = MerkleTree(
    [hashlib.sha256(b"\x00" + i.to_bytes(4, "big")).digest() for i in range(MAX_SIZE)]
)


def _fails(check: Callable[[], None]) -> bool:
    try:
        check()
    except VerificationError:
        return True
    return False


def _flip(h: bytes, bit: int) -> bytes:
    b = bytearray(h)
    b[bit // 8 % 32] ^= 1 << (bit % 8)
    return bytes(b)


def _shape(index: int, size: int) -> list[bool]:
    """Independent oracle: for each proof hash, leaf-first, is the sibling on the right?"""
    sides: list[bool] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = 1 << ((hi - lo - 1).bit_length() - 1)
        sides.append(index < lo + k)
        lo, hi = (lo, lo + k) if index < lo + k else (lo + k, hi)
    return sides[::-1]


def _wrong_sizes(index: int, size: int) -> list[int]:
    """Sizes around ``size`` whose audit path for ``index`` has a different shape.

    The verifier uses the size only for the path's shape: a size with the same shape (for
    leaf 0: 3 and 4) is the same computation and verifies the same root. The size itself
    is authenticated by the signed checkpoint (see test_note.py, tlog proofs).
    """
    out = []
    for other in (size - 1, size + 1, size * 2, size // 2, size + 7):
        if other > index and _shape(index, other) == _shape(index, size):
            continue
        out.append(other)
    return out


def _inclusion_mutations(index: int, size: int, proof: list[bytes]) -> list[Callable[[], None]]:
    leaf, root = TREE.leaves[index], TREE.root(size)
    extra = hashlib.sha256(b"extra").digest()
    cases: list[Callable[[], None]] = [
        lambda: verify_inclusion(_flip(leaf, index * 7), index, size, proof, root),
        lambda: verify_inclusion(leaf, index, size, proof, _flip(root, size)),
        lambda: verify_inclusion(leaf, index + 1, size, proof, root),
        lambda: verify_inclusion(leaf, index - 1, size, proof, root),
        lambda: verify_inclusion(leaf, index, size, [*proof, extra], root),
        lambda: verify_inclusion(leaf, index, size, [extra, *proof], root),
        lambda: verify_inclusion(leaf, index, size, [*proof, root], root),
        lambda: verify_inclusion(leaf, size, size, proof, root),
        lambda: verify_inclusion(leaf[:31], index, size, proof, root),
    ]
    for other in _wrong_sizes(index, size):
        cases.append(lambda o=other: verify_inclusion(leaf, index, o, proof, root))
    if proof:
        cases.append(lambda: verify_inclusion(leaf, index, size, proof[:-1], root))
        cases.append(lambda: verify_inclusion(leaf, index, size, proof[1:], root))
    for i in range(len(proof)):
        mutated = [*proof[:i], _flip(proof[i], i * 31 + index), *proof[i + 1 :]]
        cases.append(lambda m=mutated: verify_inclusion(leaf, index, size, m, root))
    return cases


@pytest.mark.parametrize("size", range(1, MAX_SIZE + 1, 1))
def test_every_inclusion_proof_verifies_and_every_mutation_fails(size: int) -> None:
    root = TREE.root(size)
    assert root == root_from_leaf_hashes(TREE.leaves[:size])
    # Mutations are checked for a spread of indexes per size (all for small trees).
    mutate = set(range(size)) if size <= 20 else {0, 1, size // 3, size // 2, size - 2, size - 1}
    for index in range(size):
        proof = TREE.inclusion_proof(index, size)
        verify_inclusion(TREE.leaves[index], index, size, proof, root)
        assert len(proof) == len(_shape(index, size))
        if index in mutate:
            for case in _inclusion_mutations(index, size, proof):
                assert _fails(case)


def _consistency_shape(m: int, n: int) -> tuple[bool, list[bool]]:
    """Independent oracle: whether the old root is a proof node, and for each proof hash
    whether it is a left sibling (shared by both trees) or a right one (new tree only)."""
    sides: list[bool] = []
    lo, hi, complete = 0, n, True
    while m != hi - lo:
        k = 1 << ((hi - lo - 1).bit_length() - 1)
        if m <= k:
            sides.append(False)
            hi = lo + k
        else:
            sides.append(True)
            lo, m, complete = lo + k, m - k, False
    return complete, sides[::-1]


def _wrong_size_pairs(size1: int, size2: int) -> list[tuple[int, int]]:
    """Size pairs near (size1, size2) whose proof has a different shape (see _wrong_sizes)."""
    candidates = [
        (size1 - 1, size2),
        (size1 + 1, size2),
        (size1, size2 + 1),
        (size1, size2 - 1),
        (size2, size1),
        (size1 * 2, size2 * 2),
        (size1, size2 * 2),
    ]
    shape = _consistency_shape(size1, size2)
    return [(a, b) for a, b in candidates if not (0 < a < b and _consistency_shape(a, b) == shape)]


def _consistency_mutations(size1: int, size2: int, proof: list[bytes]) -> list[Callable[[], None]]:
    r1, r2 = TREE.root(size1), TREE.root(size2)
    extra = hashlib.sha256(b"extra").digest()
    cases: list[Callable[[], None]] = [
        lambda: verify_consistency(size1, size2, _flip(r1, size1), r2, proof),
        lambda: verify_consistency(size1, size2, r1, _flip(r2, size2), proof),
        lambda: verify_consistency(size1, size2, r2, r1, proof),
        lambda: verify_consistency(size2, size1, r2, r1, proof),
        lambda: verify_consistency(size1, size2, r1, r2, [*proof, extra]),
        *[
            lambda a=a, b=b: verify_consistency(a, b, r1, r2, proof)
            for a, b in _wrong_size_pairs(size1, size2)
        ],
        lambda: verify_consistency(size1, size2, r1, r2, [extra, *proof]),
        lambda: verify_consistency(size1, size2, r1, r2, proof[:-1]),
        lambda: verify_consistency(size1, size2, r1, r2, proof[1:]),
        lambda: verify_consistency(size1, size2, r1, r2, [r1, *proof]),
    ]
    for i in range(len(proof)):
        mutated = [*proof[:i], _flip(proof[i], i * 13 + size1), *proof[i + 1 :]]
        cases.append(lambda m=mutated: verify_consistency(size1, size2, r1, r2, m))
    return cases


@pytest.mark.parametrize("size2", range(1, MAX_SIZE + 1))
def test_every_consistency_proof_verifies_and_every_mutation_fails(size2: int) -> None:
    r2 = TREE.root(size2)
    mutate = set(range(1, size2)) if size2 <= 24 else {1, 2, size2 // 2, size2 - 1}
    for size1 in range(1, size2 + 1):
        proof = TREE.consistency_proof(size1, size2)
        verify_consistency(size1, size2, TREE.root(size1), r2, proof)
        if size1 == size2:
            assert proof == []
            assert _fails(partial(verify_consistency, size1, size2, r2, r2, [r2]))
        elif size1 in mutate:
            cases = _consistency_mutations(size1, size2, proof)
            for number, case in enumerate(cases):
                assert _fails(case), (size1, size2, number)


def test_generation_refuses_impossible_requests() -> None:
    tree = MerkleTree(TREE.leaves[:5])
    for bad in [
        lambda: tree.inclusion_proof(5),
        lambda: tree.inclusion_proof(-1),
        lambda: tree.consistency_proof(0),
        lambda: tree.consistency_proof(6),
        lambda: tree.inclusion_proof(0, 6),
        lambda: MerkleTree([b"short"]),
    ]:
        with pytest.raises(UsageError):
            bad()


def test_empty_tree_has_no_inclusion_proof() -> None:
    with pytest.raises(VerificationError, match="not below tree size"):
        verify_inclusion(TREE.leaves[0], 0, 0, [], TREE.root(0))


def test_overlong_proofs_are_refused_before_hashing() -> None:
    with pytest.raises(VerificationError, match="more than any tree needs"):
        verify_inclusion(TREE.leaves[0], 0, 2**64 - 1, [TREE.leaves[0]] * 66, TREE.root(1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=8), min_size=1, max_size=64), st.data())
def test_module_level_helpers_agree_with_the_tree(
    entries: list[bytes], data: st.DataObject
) -> None:
    tree = MerkleTree.from_entries(entries)
    index = data.draw(st.integers(0, len(entries) - 1))
    size1 = data.draw(st.integers(1, len(entries)))
    assert inclusion_proof(tree.leaves, index) == tree.inclusion_proof(index)
    assert consistency_proof(tree.leaves, size1) == tree.consistency_proof(size1)
    verify_inclusion(tree.leaves[index], index, tree.size, tree.inclusion_proof(index), tree.root())


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33, 64])
def test_a_wrong_size_verifies_exactly_when_the_path_shape_is_unchanged(size: int) -> None:
    for index in range(size):
        proof = TREE.inclusion_proof(index, size)
        root = TREE.root(size)
        for other in range(index + 1, 2 * size + 2):
            same = _shape(index, other) == _shape(index, size)
            passed = not _fails(
                partial(verify_inclusion, TREE.leaves[index], index, other, proof, root)
            )
            assert passed == same, (index, size, other)
    for size1 in range(1, size):
        proof = TREE.consistency_proof(size1, size)
        r1, r2 = TREE.root(size1), TREE.root(size)
        for a in range(1, 2 * size):
            for b in range(a + 1, 2 * size):
                same = _consistency_shape(a, b) == _consistency_shape(size1, size)
                passed = not _fails(partial(verify_consistency, a, b, r1, r2, proof))
                assert passed == same, (size1, size, a, b)
