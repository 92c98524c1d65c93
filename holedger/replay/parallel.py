"""Signature verification in worker processes, for replaying long runs on several cores.

Ed25519 verification is most of replay's cost and each signature is independent of the
others, so it parallelises; everything that depends on order (seq, chain, Merkle
frontier, checkpoints, projections) stays in the calling process. Records are parsed in
chunks; a chunk's signatures go to a worker with the keys RunOpened declares, or are
verified here when the workers already have enough waiting; results are consumed
strictly in stream order, so the report is exactly the one a single-process replay gives.
A verdict from a worker is used only if it was computed with the key the in-order pass
would use; otherwise (a run whose RunOpened is damaged, say) the signature is verified
again in order.
"""

from __future__ import annotations

import base64
import binascii
import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from holedger.errors import VerificationError
from holedger.ledger.records import Record, parse_record

if TYPE_CHECKING:
    from holedger.replay.engine import _Verifier

CHUNK = 256
LOCAL_CHUNK = 128
WAITING_PER_WORKER = 4  # chunks queued for one worker before this process verifies one itself
WINDOW = 64  # chunks parsed ahead of the in-order checks at most

Job = tuple[str, bytes, bytes]  # role, signed bytes, signature
Parsed = Record | VerificationError


def verify_chunk(keys: dict[str, bytes], jobs: list[Job]) -> list[bool | None]:
    """For each job: did its role's key verify it (None: no key for the role)."""
    verifiers = {role: Ed25519PublicKey.from_public_bytes(raw) for role, raw in keys.items()}
    out: list[bool | None] = []
    for role, signed, signature in jobs:
        verifier = verifiers.get(role)
        if verifier is None:
            out.append(None)
            continue
        try:
            verifier.verify(signature, signed)
            out.append(True)
        except InvalidSignature:
            out.append(False)
    return out


def declared_keys(rec: Parsed) -> dict[str, bytes]:
    """The role keys a RunOpened record declares, read without trusting it.

    Only a guess for dispatching work: the in-order pass decides what is trusted.
    """
    if not isinstance(rec, Record) or rec.type != "RunOpened":
        return {}
    keys: dict[str, bytes] = {}
    declared = rec.payload.get("keys")
    if not isinstance(declared, dict):
        return {}
    for role, info in declared.items():
        if isinstance(info, dict) and isinstance(info.get("public_key"), str):
            try:
                raw = base64.b64decode(info["public_key"], validate=True)
            except binascii.Error:
                continue
            if len(raw) == 32:
                keys[str(role)] = raw
    return keys


def _parse(raw: bytes) -> Parsed:
    try:
        return parse_record(raw)
    except VerificationError as exc:
        return exc


def _chunks(records: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    it = iter(records)
    while chunk := list(islice(it, size)):
        yield chunk


def _context() -> Any:
    """A start method that never copies this process's open database connections."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])  # workers start forked, already imported
        return ctx
    return multiprocessing.get_context("spawn")


def feed_in_chunks(verifier: _Verifier, records: Iterable[bytes]) -> None:
    """Feed ``records`` to ``verifier`` in order, in this process, a chunk at a time.

    The same pipeline as with workers: parse a chunk, verify its signatures one after
    another, then check each record in order. Verifying back to back keeps Ed25519's
    tables in the CPU cache instead of interleaving them with parsing.
    """
    keys: dict[str, bytes] | None = None
    for chunk in _chunks(records, LOCAL_CHUNK):
        parsed = [_parse(raw) for raw in chunk]
        if keys is None:
            keys = declared_keys(parsed[0])
        jobs = [(r.role, r.signed, r.signature) for r in parsed if isinstance(r, Record)]
        _feed_chunk(verifier, parsed, keys, verify_chunk(keys, jobs))


def _feed_chunk(
    verifier: _Verifier, parsed: list[Parsed], used: dict[str, bytes], valid: list[bool | None]
) -> None:
    results = iter(valid)
    for item in parsed:
        if isinstance(item, VerificationError):
            verifier.feed_unparsed(item)
            continue
        ok = next(results)
        key = used.get(item.role)
        verifier.feed_parsed(item, None if ok is None or key is None else (key, ok))


def feed_in_parallel(verifier: _Verifier, records: Iterable[bytes], workers: int) -> None:
    """Feed ``records`` to ``verifier`` in order, verifying signatures in ``workers``
    processes: this one and ``workers - 1`` others.

    A chunk's signatures go to a worker process while the workers have fewer than
    WAITING_PER_WORKER chunks each still to verify; otherwise this process verifies them
    itself, between parsing and checking chunks. So ``workers`` processes stay busy (no more
    than asked for, none waiting while there is work), and the share this process
    verifies adapts to how much else it has to do.
    """
    Verdicts = list[bool | None]
    keys: dict[str, bytes] | None = None
    window: deque[tuple[list[Parsed], dict[str, bytes], Future[Verdicts] | Verdicts]] = deque()
    limit = WAITING_PER_WORKER * (workers - 1)
    with ProcessPoolExecutor(max_workers=workers - 1, mp_context=_context()) as pool:

        def drain(block: bool) -> None:
            while window:
                parsed, used, verdicts = window[0]
                if isinstance(verdicts, Future):
                    if not (block or verdicts.done()):
                        return
                    verdicts = verdicts.result()
                window.popleft()
                _feed_chunk(verifier, parsed, used, verdicts)
                block = False

        for chunk in _chunks(records, CHUNK):
            parsed = [_parse(raw) for raw in chunk]
            if keys is None:
                keys = declared_keys(parsed[0])
            jobs = [(r.role, r.signed, r.signature) for r in parsed if isinstance(r, Record)]
            waiting = sum(1 for _, _, v in window if isinstance(v, Future) and not v.done())
            if waiting < limit:
                window.append((parsed, keys, pool.submit(verify_chunk, keys, jobs)))
            else:
                window.append((parsed, keys, verify_chunk(keys, jobs)))
            drain(block=len(window) > WINDOW)
        while window:
            drain(block=True)
