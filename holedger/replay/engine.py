"""Replay's verification core: check a run's records and hand them to the folds given.

Integrity comes first and trusts nothing: each record must be canonical, signed by the
key that RunOpened declares for its role (or a key pinned with ``--trusted-key``),
numbered contiguously from 0, chained to its predecessor, and covered by checkpoints
whose roots are recomputed here. Only events that pass go on to the folds the caller
gives, which re-derive every recorded decision; the engine knows none of them (the
registered checks and what they are given are composed in holedger.replay.runs).

Memory is bounded by the folds' state plus an O(log n) Merkle frontier: the
records stream through once.
"""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from holedger.errors import SchemaError, VerificationError
from holedger.ledger.edwards import public_key_problem
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import parse_checkpoint, verify_note
from holedger.ledger.records import Record
from holedger.protocol.runs import origin_of
from holedger.replay.chunks import BLOB_FIELDS, ChunkJob, ChunkSummary
from holedger.replay.context import BlobSource, Fold, FoldFactory, InputsT, ReplayContext
from holedger.replay.parallel import feed_in_chunks, feed_in_parallel
from holedger.replay.report import ReplayReport, ReportBuilder
from holedger.schemas.events import AFTER_CLOSE_TYPES, Checkpoint, Model, RunOpened
from holedger.schemas.types import ZERO_HASH

# What may follow RunClosed: checkpoints, and an audit's control evaluations (their form
# is checked by replay/checks/audit_controls.py).
AFTER_CLOSE = AFTER_CLOSE_TYPES | {"Checkpoint"}

CHECKS = (
    ("records", "every record is canonical JSON with a valid envelope"),
    ("run", "every record belongs to this run"),
    ("keys", "RunOpened declares the keys by role"),
    ("signatures", "every event is signed by its role's declared key"),
    ("sequence", "seq is contiguous from 0"),
    ("chain", "every prev_hash is the previous event's hash"),
    ("schema", "every event type, schema version and payload is known"),
    ("blobs", "every referenced blob is present and matches its digest"),
    ("checkpoints", "every checkpoint root and note signature verifies"),
    ("closed", "the run is closed and its final checkpoint covers every event"),
)


class _Verifier(Generic[InputsT]):
    """The integrity pass over one run's records."""

    def __init__(
        self,
        run_id: str,
        blobs: BlobSource,
        trusted: Sequence[PublicKey],
        factories: Sequence[FoldFactory[InputsT]],
        out: ReportBuilder,
        inputs: InputsT,
    ) -> None:
        self.run_id = run_id
        self.inputs = inputs
        self.blobs = blobs
        self.trusted = list(trusted)
        self.factories = factories
        self.out = out
        self.frontier = MerkleFrontier()
        self.expected_seq = 0
        self.prev_hash = ZERO_HASH
        self.role_keys: dict[str, PublicKey] = {}
        # role -> (key id, verifier), built on first use
        self.role_state: dict[str, tuple[str, Ed25519PublicKey]] = {}

        self.folds: list[Fold] = []
        self.ctx: ReplayContext[InputsT] | None = None
        self.opened: RunOpened | None = None
        self.events = 0
        self.last_type: str | None = None
        self.closed_at: int | None = None
        self.after_close: list[tuple[int, str]] = []
        self.final_checkpoint_ok = False
        self.verified_through = -1
        self.intact = True
        self.redacted: set[str] = set()  # digests of the redacted blobs events name
        for name, detail in CHECKS:
            out.declare(name, detail)

    # ------------------------------------------------------------ per record

    def feed(self, raw: bytes) -> None:
        try:
            rec = parse_record(raw)
        except VerificationError as exc:
            self.feed_unparsed(exc)
            return
        self.feed_parsed(rec)

    def feed_unparsed(self, exc: VerificationError) -> None:
        """A record that is not even a well-formed envelope."""
        self.events += 1
        self._broken(self.expected_seq, None, exc.message, "records")
        self.expected_seq += 1

    def feed_parsed(self, rec: Record) -> None:
        """Check one parsed record in stream order."""
        self.events += 1
        seq, etype = rec.seq, rec.type
        if rec.run_id != self.run_id:
            self._broken(seq, etype, f"record belongs to run {rec.run_id}", "run")
        if seq != self.expected_seq:
            what = "missing" if seq > self.expected_seq else "repeated or out of order"
            self._broken(seq, etype, f"expected seq {self.expected_seq} ({what})", "sequence")
        if rec.prev_hash != self.prev_hash:
            self._broken(seq, etype, "prev_hash does not match the previous event", "chain")
        if seq == 0 or (self.opened is None and etype == "RunOpened"):
            self._open(rec)
        elif etype == "RunOpened":
            self._broken(seq, etype, "a second RunOpened", "keys")
        self._check_signature(rec)
        payload = self._check_schema(rec)
        if isinstance(payload, Checkpoint):
            self._check_checkpoint(rec, payload)  # covers the leaves before its own
        self.frontier.append(rec.leaf_hash)
        self.prev_hash = rec.event_hash
        self.expected_seq = seq + 1
        if self.closed_at is not None and etype not in AFTER_CLOSE:
            self.after_close.append((seq, etype))
        if etype == "RunClosed":
            if self.closed_at is not None:
                self._broken(seq, etype, "a second RunClosed", "closed")
            self.closed_at = seq
        self.last_type = etype
        if payload is None:
            return
        self._check_blobs(rec, payload)
        if self.intact:
            self.verified_through = seq
            for fold in self.folds:
                fold.apply(rec, payload)

    def chunk_job(self, records: list[bytes]) -> ChunkJob | None:
        """A job for chunks.check_chunk with the keys this pass trusts, or None when the
        run is not open yet (its first record must come through ``feed``)."""
        if self.opened is None or not self.role_keys:
            return None
        keys = tuple((role, k.name, k.raw) for role, k in sorted(self.role_keys.items()))
        return ChunkJob(self.run_id, keys, records)

    def feed_chunk(self, job: ChunkJob, summary: ChunkSummary | None) -> None:
        """Take a chunk that chunks.check_chunk passed whole, or check it record by record.

        The summary is taken only where it continues this pass exactly: made with the
        keys trusted now, starting at the expected seq and chained to the previous event,
        the run not closed before it, and every checkpoint root it claims equal to the
        root recomputed here. Otherwise, and when there is no summary, each record goes
        through ``feed``, which names what is wrong; the outcome is the same either way.
        """
        if summary is None or not self._take(job, summary):
            for raw in job.records:
                self.feed(raw)

    def _take(self, job: ChunkJob, summary: ChunkSummary) -> bool:
        current = self.chunk_job(job.records)
        if (
            current is None
            or current.keys != job.keys
            or summary.first_seq != self.expected_seq
            or summary.first_prev != self.prev_hash
            or self.closed_at is not None
        ):
            return False
        frontier = self.frontier.copy()
        leaves = summary.leaves
        done = 0
        final_checkpoint = False
        for offset, root in summary.checkpoints:
            frontier.extend(leaves, done, offset)
            done = offset
            if frontier.root().hex() != root:
                return False
            if summary.closed is not None and offset == summary.closed + 1:
                final_checkpoint = True
        count = len(job.records)
        frontier.extend(leaves, done, count)
        # The chunk continues this pass: take it.
        first = summary.first_seq
        self.frontier = frontier
        self.events += count
        self.expected_seq = first + count
        self.prev_hash = summary.last_hash
        self.last_type = summary.last_type
        if summary.closed is not None:
            self.closed_at = first + summary.closed
            self.final_checkpoint_ok = final_checkpoint
        intact = self.intact
        verified = count
        for offset, etype, name, digest in summary.blobs:
            if not self._blob_ok(first + offset, etype, name, digest) and verified == count:
                verified = offset
        if intact:
            self.verified_through = first + verified - 1
            if self.folds:
                for raw in job.records[:verified]:
                    rec = parse_record(raw)
                    payload = rec.typed_payload()
                    for fold in self.folds:
                        fold.apply(rec, payload)
        return True

    def _broken(self, seq: int | None, etype: str | None, reason: str, check: str) -> None:
        self.intact = False
        self.out.fail(seq, etype, reason, check=check)

    def _open(self, rec: Record) -> None:
        if rec.type != "RunOpened" or rec.seq != 0:
            self._broken(rec.seq, rec.type, "the run does not start with RunOpened", "keys")
            return
        try:
            opened = rec.typed_payload()
        except SchemaError as exc:
            self._broken(rec.seq, rec.type, exc.message, "keys")
            return
        assert isinstance(opened, RunOpened)
        self.opened = opened
        self.out.section(
            "run",
            {
                "task_id": opened.task_id,
                "task_digest": opened.task_digest,
                "optimizer": opened.optimizer,
                "descriptor": None
                if opened.descriptor is None
                else opened.descriptor.model_dump(mode="json"),
            },
        )
        declared: dict[str, PublicKey] = {}
        for role_name, info in opened.keys.items():
            role: str = role_name
            key = PublicKey.declared(info.name, info.public_key)
            if len(key.raw) != 32 or key.key_id_hex != info.key_id:
                self._broken(0, rec.type, f"declared {role} key is malformed", "keys")
                return
            problem = public_key_problem(key.raw)
            if problem is not None:
                self._broken(0, rec.type, f"declared {role} key is unusable: {problem}", "keys")
                return
            declared[role] = key
        if self.trusted:
            pinned = {(k.name, k.raw) for k in self.trusted}
            for role, key in declared.items():
                if (key.name, key.raw) not in pinned:
                    self._broken(
                        0,
                        rec.type,
                        f"RunOpened declares {role} key {key.name}+{key.key_id_hex}, "
                        "which is not a trusted key",
                        "keys",
                    )
            self.out.section(
                "trust", {"source": "pinned", "keys": [k.vkey() for k in self.trusted]}
            )
        else:
            taken = sorted({k.vkey() for k in declared.values()})
            self.out.section("trust", {"source": "declared (taken on trust)", "keys": taken})
            self.out.check(
                "keys",
                self.out.ok("keys"),
                "keys taken on trust from RunOpened: "
                + ", ".join(taken)
                + " (pin with --trusted-key)",
            )
            # A warning, not a failure: the log is consistent with the keys it declares,
            # but a log re-signed whole with anyone's key is as consistent.
            self.out.warn(
                "keys_pinned",
                False,
                "no trusted key given: the checks prove the log consistent with the keys "
                "it declares, and a log re-signed whole with another key would pass them "
                "too; pin the operator's verifier key, obtained from the operator and not "
                "from the run, with --trusted-key",
            )
        self.role_keys = declared
        self.role_state = {}
        self.ctx = ReplayContext(self.run_id, opened, self.blobs, self.inputs)
        self.folds = [factory(self.ctx) for factory in self.factories]

    def _check_signature(self, rec: Record) -> None:
        role = rec.role
        state = self.role_state.get(role)
        if state is None:
            key = self.role_keys.get(role)
            if key is None:
                self._broken(rec.seq, rec.type, f"no key declared for role {role}", "signatures")
                return
            state = self.role_state[role] = (key.key_id_hex, key.verifier())
        key_id, verifier = state
        if rec.key_id != key_id:
            self._broken(
                rec.seq, rec.type, f"signed by key {rec.key_id}, not {role}'s", "signatures"
            )
            return
        try:
            verifier.verify(rec.signature, rec.signed)
        except InvalidSignature:
            self._broken(rec.seq, rec.type, "signature does not verify", "signatures")

    def _check_schema(self, rec: Record) -> Model | None:
        try:
            return rec.typed_payload()
        except SchemaError as exc:
            self._broken(rec.seq, rec.type, exc.message, "schema")
            return None

    def _check_checkpoint(self, rec: Record, cp: Checkpoint) -> None:
        seq, etype = rec.seq, rec.type
        if rec.role != "server":
            self._broken(seq, etype, "checkpoint not written by the server role", "checkpoints")
            return
        if cp.size != seq:
            self._broken(seq, etype, f"checkpoint size {cp.size} is not {seq}", "checkpoints")
            return
        expected_root = self.frontier.root()
        if cp.root != expected_root.hex():
            self._broken(
                seq, etype, "checkpoint root differs from the recomputed root", "checkpoints"
            )
            return
        server = self.role_keys.get("server")
        if server is None:
            return
        try:
            note = verify_note(cp.note, server)
            body = parse_checkpoint(note.text)
        except VerificationError as exc:
            self._broken(seq, etype, f"checkpoint note: {exc.message}", "checkpoints")
            return
        if body.origin != origin_of(self.run_id):
            self._broken(
                seq, etype, f"checkpoint origin {body.origin!r} is not this run's", "checkpoints"
            )
        elif body.size != cp.size or body.root != expected_root:
            self._broken(seq, etype, "checkpoint note disagrees with its event", "checkpoints")
        elif self.closed_at is not None and seq == self.closed_at + 1:
            self.final_checkpoint_ok = True

    def _check_blobs(self, rec: Record, payload: Model) -> None:
        for name in BLOB_FIELDS.get(rec.type, ()):
            digest = getattr(payload, name)
            if digest:
                self._blob_ok(rec.seq, rec.type, name, str(digest))

    def _blob_ok(self, seq: int, etype: str, name: str, digest: str) -> bool:
        """Whether the blob an event names is present (or redacted) and matches its digest."""
        data = self.blobs.blob(digest)
        if data is None:
            if self.blobs.redacted(digest):
                self.redacted.add(digest)
                return True
            self._broken(seq, etype, f"blob {name} {digest[:12]} is missing", "blobs")
            return False
        if hashlib.sha256(data).hexdigest() != digest:
            self._broken(seq, etype, f"blob {name} {digest[:12]} was altered", "blobs")
            return False
        return True

    # ------------------------------------------------------------ the end

    def finish(self) -> None:
        out = self.out
        if self.events == 0:
            out.fail(None, None, "the run has no events", check="records")
            return
        if self.opened is None:
            out.fail(None, None, "no RunOpened: nothing can be trusted", check="keys")
        if self.closed_at is None:
            # Named at the first seq that is missing: where a truncation would begin.
            out.fail(
                self.expected_seq,
                None,
                f"the run ends at seq {self.expected_seq - 1} without RunClosed: "
                f"truncated or still open (verified through seq {self.verified_through})",
                check="closed",
            )
        elif self.after_close:
            seq, etype = self.after_close[0]
            out.fail(seq, etype, "event after RunClosed", check="closed")
        elif not (self.final_checkpoint_ok and self.last_type == "Checkpoint"):
            out.fail(
                self.closed_at + 1,
                None,
                "no final checkpoint after RunClosed covers the run",
                check="closed",
            )
        if self.redacted:  # counted as the bundle's export counts them: distinct blobs
            out.section("redacted", {"blobs": len(self.redacted)})
            out.check("blobs", out.ok("blobs"), f"{len(self.redacted)} blobs redacted: not checked")
        if not self.intact and self.ctx is not None:
            self.ctx.cut_after = self.verified_through
        for fold in self.folds:
            fold.finish(out)
        if not self.intact and self.folds:
            # What the folds found holds for the intact prefix of the log only (the
            # events after the first break were not applied): say so on each of them.
            through = self.verified_through
            out.qualify(
                {name for name, _ in CHECKS} | {"keys_pinned", "git_history"},
                f"[judged on seq 0 to {through} only, where the log is intact] "
                if through >= 0
                else "[judged on no event: the log is broken from its start] ",
            )


def verify_log(
    run_id: str,
    records: Iterable[bytes],
    blobs: BlobSource,
    folds: Sequence[FoldFactory[InputsT]],
    inputs: InputsT,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    workers: int = 1,
    fast: bool = True,
) -> ReplayReport:
    """Verify one run from its record bytes in stream order, folding the verified events
    into ``folds`` (each built with a ReplayContext that carries ``inputs``).

    Records are checked a chunk at a time (replay/chunks.py), in ``workers`` processes
    (this one and ``workers - 1`` others), and a chunk with anything wrong in it record by
    record; with ``fast`` False every record is checked record by record, in this
    process. The report is the same every way.
    """
    out = ReportBuilder()
    verifier = _Verifier(run_id, blobs, trusted_keys, folds, out, inputs)
    with _no_cyclic_gc():
        if not fast:
            for raw in records:
                verifier.feed(raw)
        elif workers > 1:
            feed_in_parallel(verifier, records, workers)
        else:
            feed_in_chunks(verifier, records)
        verifier.finish()
    return out.build(run_id, verifier.events)


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while records stream through.

    Each record leaves a handful of short-lived containers (its model instances) that
    reference counting frees; the collector would still walk them, and every object the
    process holds, over and over (about a fifth of replay's own time). Nothing replay
    builds is cyclic, so pausing it holds no memory back. The collector is process-wide:
    overlapping replays (threads of a server) pause it once, and the last one to finish
    restores it as it was.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def with_progress(
    batches: Iterable[list[bytes]], total: int, progress: Callable[[int, int], None]
) -> Iterator[bytes]:
    """The records of ``batches`` in order, calling ``progress(done, total)`` each time
    the next batch is asked for (every record before it has been fed on)."""
    done = 0
    for batch in batches:
        yield from batch
        done += len(batch)
        progress(done, total)
