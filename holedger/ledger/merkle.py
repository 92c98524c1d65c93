"""RFC 6962 / RFC 9162 Merkle tree hashing over a run's event leaves.

* leaf hash  = SHA-256(0x00 || leaf bytes)            (RFC 9162 section 2.1.1)
* node hash  = SHA-256(0x01 || left || right)
* MTH of n > 1 leaves splits at k, the largest power of two smaller than n.
* the empty tree's root is SHA-256 of the empty string.
"""

from __future__ import annotations

import hashlib

_sha256 = hashlib.sha256
EMPTY_ROOT = _sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaf_hashes(hashes: list[bytes]) -> bytes:
    """MTH(D[n]) from the leaf hashes (RFC 9162 section 2.1.1)."""
    if not hashes:
        return EMPTY_ROOT
    if len(hashes) == 1:
        return hashes[0]
    k = split_point(len(hashes))
    return node_hash(root_from_leaf_hashes(hashes[:k]), root_from_leaf_hashes(hashes[k:]))


class MerkleFrontier:
    """Append-only tree state in O(log n) memory: the roots of the perfect subtrees.

    ``_hashes[i]`` is the root of a perfect subtree; their sizes are the powers of two in
    the binary digits of ``size``, largest first. Appending a leaf merges it with the
    last subtree for every trailing 1 bit of ``size``. The tree root folds them right to
    left, which equals MTH for every size.
    """

    __slots__ = ("_hashes", "size")

    def __init__(self) -> None:
        self._hashes: list[bytes] = []
        self.size = 0

    def append(self, leaf: bytes) -> None:
        """Add one leaf *hash*."""
        hashes = self._hashes
        node = leaf
        size = self.size
        while size & 1:
            node = _sha256(b"\x01" + hashes.pop() + node).digest()
            size >>= 1
        hashes.append(node)
        self.size += 1

    def extend(self, leaves: bytes, start: int, end: int) -> None:
        """Add the leaf hashes ``start`` to ``end`` (exclusive) of ``leaves``, a
        concatenation of 32-byte leaf hashes: the same as appending them one by one.

        Level by level instead of leaf by leaf: at height h the new perfect subtrees of
        that height (after the frontier's own one of height h, when ``size`` has bit h)
        are hashed pairwise into those of height h + 1; an odd one out stays a subtree of
        the new frontier. So each node hash costs one step of a list comprehension.
        """
        if end <= start:
            return
        nodes = [leaves[at : at + 32] for at in range(start * 32, end * 32, 32)]
        hashes = self._hashes
        size = self.size
        self.size += end - start
        kept: list[bytes] = []  # one subtree per height at most, lowest first
        height = 0
        while nodes:
            if size >> height & 1:
                nodes.insert(0, hashes.pop())
            if len(nodes) & 1:
                kept.append(nodes.pop())
            lefts, rights = nodes[0::2], nodes[1::2]  # an even number of nodes
            nodes = [
                _sha256(b"\x01" + left + right).digest()
                for left, right in zip(lefts, rights, strict=True)
            ]
            height += 1
        hashes.extend(reversed(kept))

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
        other.size = self.size
        return other
