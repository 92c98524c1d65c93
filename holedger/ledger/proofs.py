"""RFC 9162 Merkle inclusion and consistency proofs: generation and verification.

Generation follows RFC 9162 section 2.1.3.1 (``PATH``) and 2.1.4.1 (``PROOF`` /
``SUBPROOF``); verification follows the bit loops of sections 2.1.3.2 and 2.1.4.2.
Every edge case is an explicit check that raises :class:`VerificationError` naming the
violated condition: index >= size, a hash that is not 32 bytes, a proof of the wrong
length, a consistency proof from the empty tree (meaningless, as transparency-dev
notes), size1 > size2, equal sizes with a non-empty proof.
"""

from __future__ import annotations

from collections.abc import Sequence

from holedger.errors import UsageError, VerificationError
from holedger.ledger.merkle import EMPTY_ROOT, leaf_hash, node_hash, split_point

HASH_SIZE = 32
# A proof never needs more hashes than the height of a 2**64-leaf tree (plus one for the
# consistency proof's prepended root). Anything longer is refused before hashing.
MAX_PROOF_HASHES = 65

__all__ = [
    "MerkleTree",
    "consistency_proof",
    "inclusion_proof",
    "root_from_inclusion_proof",
    "verify_consistency",
    "verify_inclusion",
]


class MerkleTree:
    """Leaf hashes plus a memo of subtree hashes, for generating many proofs cheaply."""

    def __init__(self, leaf_hashes: Sequence[bytes]) -> None:
        for h in leaf_hashes:
            if len(h) != HASH_SIZE:
                raise UsageError("a leaf hash is 32 bytes")
        self.leaves: list[bytes] = list(leaf_hashes)
        self._memo: dict[tuple[int, int], bytes] = {}

    @classmethod
    def from_entries(cls, entries: Sequence[bytes]) -> MerkleTree:
        """A tree over raw entries (each hashed as an RFC 6962 leaf)."""
        return cls([leaf_hash(e) for e in entries])

    @property
    def size(self) -> int:
        return len(self.leaves)

    def append(self, leaf: bytes) -> None:
        if len(leaf) != HASH_SIZE:
            raise UsageError("a leaf hash is 32 bytes")
        self.leaves.append(leaf)

    def subtree(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) (RFC 9162 section 2.1.1)."""
        if lo == hi:
            return EMPTY_ROOT
        if hi - lo == 1:
            return self.leaves[lo]
        key = (lo, hi)
        cached = self._memo.get(key)
        if cached is None:
            k = split_point(hi - lo)
            cached = node_hash(self.subtree(lo, lo + k), self.subtree(lo + k, hi))
            self._memo[key] = cached
        return cached

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise UsageError(f"tree size {size} is outside 0..{self.size}")
        return self.subtree(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """PATH(index, D[0:size]) (RFC 9162 section 2.1.3.1), leaf's sibling first."""
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise UsageError(f"tree size {size} is outside 0..{self.size}")
        if not 0 <= index < size:
            raise UsageError(f"leaf index {index} is not in a tree of size {size}")
        path: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            k = split_point(hi - lo)
            if index < lo + k:
                path.append(self.subtree(lo + k, hi))
                hi = lo + k
            else:
                path.append(self.subtree(lo, lo + k))
                lo = lo + k
        path.reverse()
        return path

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        """PROOF(size1, D[0:size2]) (RFC 9162 section 2.1.4.1)."""
        size2 = self.size if size2 is None else size2
        if not 0 <= size2 <= self.size:
            raise UsageError(f"tree size {size2} is outside 0..{self.size}")
        if not 0 < size1 <= size2:
            raise UsageError(f"no consistency proof from size {size1} to size {size2}")
        return self._subproof(size1, 0, size2, True)

    def _subproof(self, m: int, lo: int, hi: int, complete: bool) -> list[bytes]:
        # Iterative SUBPROOF: walk down, collecting the sibling subtrees, then reverse.
        out: list[bytes] = []
        while True:
            n = hi - lo
            if m == n:
                if not complete:
                    out.append(self.subtree(lo, hi))
                break
            k = split_point(n)
            if m <= k:
                out.append(self.subtree(lo + k, hi))
                hi = lo + k
            else:
                out.append(self.subtree(lo, lo + k))
                lo, m, complete = lo + k, m - k, False
        out.reverse()
        return out


def inclusion_proof(leaf_hashes: Sequence[bytes], index: int) -> list[bytes]:
    """The inclusion proof of leaf ``index`` in the tree of all ``leaf_hashes``."""
    return MerkleTree(leaf_hashes).inclusion_proof(index)


def consistency_proof(leaf_hashes: Sequence[bytes], size1: int) -> list[bytes]:
    """The consistency proof from the first ``size1`` leaves to all ``leaf_hashes``."""
    return MerkleTree(leaf_hashes).consistency_proof(size1)


def _check_hash(value: bytes, what: str) -> None:
    if len(value) != HASH_SIZE:
        raise VerificationError(f"{what} is {len(value)} bytes, not {HASH_SIZE}")


def _check_proof(proof: Sequence[bytes]) -> None:
    if len(proof) > MAX_PROOF_HASHES:
        raise VerificationError(f"proof has {len(proof)} hashes, more than any tree needs")
    for i, h in enumerate(proof):
        _check_hash(h, f"proof hash {i}")


def root_from_inclusion_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for ``leaf`` at ``index`` (RFC 9162 2.1.3.2)."""
    if index < 0 or size < 0:
        raise VerificationError("leaf index and tree size must not be negative")
    if index >= size:
        raise VerificationError(f"leaf index {index} is not below tree size {size}")
    _check_hash(leaf, "leaf hash")
    _check_proof(proof)
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise VerificationError("inclusion proof is longer than the tree is high")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError("inclusion proof is shorter than the tree is high")
    return r


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf`` is at ``index`` in the tree of ``size`` leaves with ``root``."""
    _check_hash(root, "root")
    if root_from_inclusion_proof(leaf, index, size, proof) != root:
        raise VerificationError("inclusion proof does not lead to the expected root")


def verify_consistency(
    size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree (size2, root2) extends the tree (size1, root1) (RFC 9162 2.1.4.2)."""
    if size1 < 0 or size2 < 0:
        raise VerificationError("tree sizes must not be negative")
    if size1 > size2:
        raise VerificationError(f"size1 {size1} is larger than size2 {size2}")
    if size1 == 0:
        raise VerificationError("a consistency proof from the empty tree is meaningless")
    _check_hash(root1, "root1")
    _check_hash(root2, "root2")
    _check_proof(proof)
    if size1 == size2:
        if proof:
            raise VerificationError("equal tree sizes need an empty consistency proof")
        if root1 != root2:
            raise VerificationError("equal tree sizes with different roots")
        return
    if not proof:
        raise VerificationError("consistency proof is empty for different tree sizes")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # size1 is a power of two: its root is a proof node
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise VerificationError("consistency proof is longer than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError("consistency proof is shorter than needed")
    if fr != root1:
        raise VerificationError("consistency proof does not lead to root1")
    if sr != root2:
        raise VerificationError("consistency proof does not lead to root2")
