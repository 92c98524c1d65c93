"""Is a 32-byte string a sound Ed25519 public key? (RFC 8032, section 5.1.3.)

A public key of small order (one of the eight points of the curve's torsion subgroup)
makes the verification equation hold for signatures nobody made: with such a key, a
signature can be forged for many messages without any private key, so whoever publishes
one can later disown what it "signed". Ed25519 libraries verify against such keys without
complaint; holedger refuses them where a key is declared or pinned, together with
encodings that are not canonical or not on the curve.

Plain integer arithmetic modulo 2**255 - 19: it runs once per key, not per signature.
"""

from __future__ import annotations

import functools

P = 2**255 - 19
D = (-121665 * pow(121666, P - 2, P)) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)

Point = tuple[int, int]
IDENTITY: Point = (0, 1)


def decode_point(raw: bytes) -> Point | None:
    """The affine point a canonical 32-byte encoding names, or None (RFC 8032 5.1.3)."""
    if len(raw) != 32:
        return None
    value = int.from_bytes(raw, "little")
    sign = value >> 255
    y = value & ((1 << 255) - 1)
    if y >= P:
        return None  # a non-canonical encoding of y
    u = (y * y - 1) % P
    v = (D * y * y + 1) % P
    x = (u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P)) % P
    vxx = (v * x * x) % P
    if vxx == (-u) % P:
        x = (x * SQRT_M1) % P
    elif vxx != u:
        return None  # no x: not on the curve
    if x == 0 and sign:
        return None
    if x & 1 != sign:
        x = P - x
    return x, y


def add(a: Point, b: Point) -> Point:
    """The sum of two points of the twisted Edwards curve -x^2 + y^2 = 1 + d x^2 y^2."""
    (x1, y1), (x2, y2) = a, b
    t = (D * x1 * x2 * y1 * y2) % P
    x3 = ((x1 * y2 + y1 * x2) * pow(1 + t, P - 2, P)) % P
    y3 = ((y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P)) % P
    return x3, y3


def multiply(point: Point, scalar: int) -> Point:
    """``scalar`` times ``point`` (double and add)."""
    result = IDENTITY
    while scalar:
        if scalar & 1:
            result = add(result, point)
        point = add(point, point)
        scalar >>= 1
    return result


def encode_point(point: Point) -> bytes:
    x, y = point
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


@functools.lru_cache(maxsize=64)
def public_key_problem(raw: bytes) -> str | None:
    """Why ``raw`` is no sound Ed25519 public key, or None when it is one (a pure
    function of the bytes: a run's few keys are checked once per process)."""
    if len(raw) != 32:
        return "not 32 bytes"
    point = decode_point(raw)
    if point is None:
        return "not a canonical encoding of a curve point"
    if multiply(point, 8) == IDENTITY:
        return "a point of small order, which would verify forged signatures"
    return None
