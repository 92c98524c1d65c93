"""RFC 6962 / RFC 9162 Merkle tree hashing over a run's event leaves.

* leaf hash  = SHA-256(0x00 || leaf bytes)            (RFC 9162 section 2.1.1)
* node hash  = SHA-256(0x01 || left || right)
* MTH of n > 1 leaves splits at k, the largest power of two smaller than n.
* the empty tree's root is SHA-256 of the empty string.
"""

from __future__ import annotations

import hashlib

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split_point(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaf_hashes(hashes: list[bytes]) -> bytes:
    """MTH(D[n]) from the leaf hashes (RFC 9162 section 2.1.1)."""
    if not hashes:
        return EMPTY_ROOT
    if len(hashes) == 1:
        return hashes[0]
    k = _split_point(len(hashes))
    return node_hash(root_from_leaf_hashes(hashes[:k]), root_from_leaf_hashes(hashes[k:]))


class MerkleFrontier:
    """Append-only tree state in O(log n) memory: the roots of the perfect subtrees.

    ``frontier[i]`` is the root of a perfect subtree; sizes strictly decrease from left
    to right, mirroring the binary digits of ``size``. The tree root folds them right
    to left, which equals MTH for every size.
    """

    __slots__ = ("_hashes", "_heights", "size")

    def __init__(self) -> None:
        self._hashes: list[bytes] = []
        self._heights: list[int] = []
        self.size = 0

    def append(self, leaf: bytes) -> None:
        """Add one leaf *hash*."""
        node, height = leaf, 0
        while self._heights and self._heights[-1] == height:
            node = node_hash(self._hashes.pop(), node)
            self._heights.pop()
            height += 1
        self._hashes.append(node)
        self._heights.append(height)
        self.size += 1

    def root(self) -> bytes:
        if not self._hashes:
            return EMPTY_ROOT
        node = self._hashes[-1]
        for left in reversed(self._hashes[:-1]):
            node = node_hash(left, node)
        return node

    def copy(self) -> MerkleFrontier:
        other = MerkleFrontier()
        other._hashes = list(self._hashes)
        other._heights = list(self._heights)
        other.size = self.size
        return other
