"""The tamper matrix: every attack on a stored run is detected and named by replay.

A realistic run of 219 events is recorded through the Ledger API, on SQLite and on
PostgreSQL; each test edits the database directly (plain SQL on ``holedger_events`` and
``holedger_blobs``), replays, checks that the report names the check and the seq, and
puts the rows back. The two byte-flip matrices over every stored record replay in memory
(the rows as read back, no database in the loop): they run on the SQLite rows, and the
database path is flipped on both backends.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.records import sign_event
from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run, verify_records

from .attacker import Attacker, Row, flip, resign_run
from .recorded_run import CHECKPOINT_INTERVAL, MemoryBlobs, record_run

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@dataclass
class Recorded:
    url: str
    ledger: Ledger
    attacker: Attacker
    run_id: str
    other_run: str
    rows: list[Row]
    other_rows: list[Row]
    key: SigningKey

    def replay(self, **kwargs: object) -> ReplayReport:
        """Replay with the integrity checks only (the other checks are other tests' business)."""
        kwargs.setdefault("checks", ())
        return replay_run(self.ledger, self.run_id, **kwargs)  # type: ignore[arg-type]

    def seq_of(self, event_type: str, nth: int = 0) -> int:
        seqs = [r.version - 1 for r in self.rows if r.topic == event_type]
        return seqs[nth]


@pytest.fixture(scope="module", params=BACKENDS)
def recorded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('tamper') / 'ledger.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    key = SigningKey.generate("holedger-operator")
    ledger = Ledger.open(url, key, checkpoint_interval=CHECKPOINT_INTERVAL)
    run_id = record_run(ledger)
    other_run = record_run(ledger, rounds=2, task_id="other-task")
    attacker = Attacker(url)
    rec = Recorded(
        url,
        ledger,
        attacker,
        run_id,
        other_run,
        attacker.rows(run_id),
        attacker.rows(other_run),
        key,
    )
    assert len(rec.rows) >= 200
    assert rec.replay().verified
    yield rec
    attacker.close()
    ledger.close()


@pytest.fixture()
def run(recorded: Recorded) -> Iterator[Recorded]:
    """The recorded run, intact before the test (as recorded, or as the previous test's
    teardown restored and replayed it) and restored after it."""
    yield recorded
    recorded.attacker.restore(recorded.run_id, recorded.rows)
    recorded.attacker.restore(recorded.other_run, recorded.other_rows)
    assert recorded.replay().verified


def assert_named(report: ReplayReport, check: str, seq: int) -> None:
    """The report fails, with ``check`` failed and a failure naming ``check`` at ``seq``."""
    assert not report.verified
    assert check in report.failed_checks(), report.checks
    named = [(f.check, f.seq) for f in report.failures]
    assert (check, seq) in named, named


def _stored_blobs(run: Recorded) -> MemoryBlobs:
    """Every blob the run references, read from the database as stored."""
    found: dict[str, bytes] = {}
    for row in run.rows:
        for name, value in parse_record(row.state).payload.items():
            if name.endswith("_digest") and isinstance(value, str) and value not in found:
                if run.ledger.has_blob(value):
                    found[value] = run.attacker.blob(value)
    return MemoryBlobs(found)


def _payload_position(raw: bytes) -> int:
    start = raw.index(b'"payload":{') + len(b'"payload":{')
    end = raw.index(b',"prev_hash":')
    return (start + end) // 2


def _signature_position(raw: bytes) -> int:
    return raw.rindex(b',"sig":"') + len(b',"sig":"') + 10


# ---------------------------------------------------------------------------- byte flips


# In memory, the same engine whichever database the rows came from: once, on SQLite's.
IN_MEMORY = pytest.mark.parametrize("recorded", ["sqlite"], indirect=True)


@IN_MEMORY
def test_one_flipped_byte_in_every_stored_event_is_named(run: Recorded) -> None:
    """Flip one payload byte of each stored record in turn (all of them); replay names it.

    The bytes are the stored rows read back from the database; replay runs the same
    engine over them in memory (the database path is exercised on a subset below).
    """
    blobs = _stored_blobs(run)
    stored = [row.state for row in run.rows]
    for index, raw in enumerate(stored):
        tampered = list(stored)
        tampered[index] = flip(raw, _payload_position(raw))
        report = verify_records(run.run_id, tampered, blobs, checks=())
        assert not report.verified, index
        first = report.failures[0]
        assert first.seq == index, (index, report.failures[:3])
        at_index = {f.check for f in report.failures if f.seq == index}
        assert at_index & {"signatures", "records"}, (index, at_index)


@IN_MEMORY
def test_flipped_signature_and_envelope_bytes_fail_the_run(run: Recorded) -> None:
    """Flips in the signature (named at the event) and at random bytes, envelope
    fields included (a flipped seq digit may be named at the seq it now claims)."""
    blobs = _stored_blobs(run)
    stored = [row.state for row in run.rows]
    rng = random.Random(6962)
    for index in range(0, len(stored), 4):
        raw = stored[index]
        for position, exact in ((_signature_position(raw), True), (rng.randrange(len(raw)), False)):
            tampered = list(stored)
            tampered[index] = flip(raw, position)
            report = verify_records(run.run_id, tampered, blobs, checks=())
            assert not report.verified, (index, position)
            if exact:
                assert report.failures[0].seq == index
                assert report.failures[0].check in {"signatures", "records"}


def test_flipped_byte_through_the_database_is_named(run: Recorded) -> None:
    """The real path: UPDATE the stored row, replay from the database, restore."""
    last = len(run.rows) - 1
    chosen = sorted(
        {0, 1, 2, CHECKPOINT_INTERVAL, run.seq_of("Checkpoint", 1), 100, last - 1, last}
    )
    for seq in chosen:
        row = run.rows[seq]
        run.attacker.set_state(
            run.run_id, row.version, flip(row.state, _payload_position(row.state))
        )
        try:
            report = run.replay()
            assert not report.verified
            assert report.failures[0].seq == seq
        finally:
            run.attacker.set_state(run.run_id, row.version, row.state)


# ---------------------------------------------------------------------------- structure


def test_deleted_middle_event_is_named(run: Recorded) -> None:
    run.attacker.delete(run.run_id, 101)  # seq 100
    report = run.replay()
    assert_named(report, "sequence", 101)
    assert any("expected seq 100" in f.reason for f in report.failures)
    assert_named(report, "chain", 101)


def test_two_swapped_events_are_named(run: Recorded) -> None:
    a, b = run.rows[50], run.rows[51]
    run.attacker.set_state(run.run_id, a.version, b.state)
    run.attacker.set_state(run.run_id, b.version, a.state)
    report = run.replay()
    assert_named(report, "sequence", 51)
    assert_named(report, "sequence", 50)


def test_event_moved_from_another_run_is_named(run: Recorded) -> None:
    run.attacker.move(run.other_run, 11, run.run_id)  # the other run's seq 10
    report = run.replay()
    assert_named(report, "run", 10)
    assert any(run.other_run in f.reason for f in report.failures if f.seq == 10)


@pytest.mark.parametrize("claimed", ["own", "declared"])
def test_forged_event_signed_by_an_undeclared_key_is_named(run: Recorded, claimed: str) -> None:
    """A well-formed, correctly chained event signed by an outsider's key."""
    outsider = SigningKey.generate("holedger-operator")  # same name, different key
    target = run.rows[20]
    original = parse_record(target.state)
    payload = dict(original.payload)
    forged = sign_event(
        outsider,
        run_id=run.run_id,
        seq=original.seq,
        event_type=original.type,
        role=original.role,  # type: ignore[arg-type]
        prev_hash=original.prev_hash,
        payload=payload,
    )
    raw = forged.raw
    if claimed == "declared":  # claim the declared key id: only the signature can tell
        raw = raw.replace(outsider.key_id_hex.encode(), run.key.key_id_hex.encode())
    run.attacker.set_state(run.run_id, target.version, raw)
    report = run.replay()
    assert_named(report, "signatures", 20)
    reason = next(f.reason for f in report.failures if f.check == "signatures")
    if claimed == "own":
        assert outsider.key_id_hex in reason
    else:
        assert "does not verify" in reason


def test_runopened_key_replaced_is_caught_by_a_pinned_key(run: Recorded) -> None:
    """The attacker re-signs the whole run under their key and re-declares it in RunOpened.

    Internally consistent, so replay without a pinned key verifies but says it took the
    attacker's key on trust; ``--trusted-key`` (the operator's real key) names seq 0.
    """
    attacker_key = SigningKey.generate("holedger-operator")
    for row, raw in zip(run.rows, resign_run(run.rows, attacker_key), strict=True):
        run.attacker.set_state(run.run_id, row.version, raw)
    unpinned = run.replay()
    assert unpinned.verified
    trust = unpinned.sections["trust"]
    assert trust["source"].startswith("declared")
    assert trust["keys"] == [attacker_key.public.vkey()]
    pinned = run.replay(trusted_keys=[run.key.public])
    assert_named(pinned, "keys", 0)
    assert attacker_key.key_id_hex in pinned.failures[0].reason


def test_genuine_run_verifies_with_the_pinned_key(run: Recorded) -> None:
    report = run.replay(trusted_keys=[run.key.public])
    assert report.verified
    assert report.sections["trust"]["source"] == "pinned"


def test_replaced_blob_content_is_named(run: Recorded) -> None:
    seq = run.seq_of("TrialCompleted", 3)
    digest = parse_record(run.rows[seq].state).payload["output_digest"]
    original = run.attacker.blob(digest)
    run.attacker.set_blob(digest, b"a different output")
    try:
        report = run.replay()
        assert_named(report, "blobs", seq)
        assert report.failed_checks() == ["blobs"]
    finally:
        run.attacker.set_blob(digest, original)


def test_tail_after_last_checkpoint_truncated_is_named(run: Recorded) -> None:
    closed = run.seq_of("RunClosed")
    last_cp = max(
        r.version - 1 for r in run.rows if r.topic == "Checkpoint" and r.version - 1 < closed
    )
    run.attacker.delete_from(run.run_id, last_cp + 2)  # keep the checkpoint, drop the rest
    report = run.replay()
    assert_named(report, "closed", last_cp + 1)
    assert report.failed_checks() == ["closed"]
    assert f"verified through seq {last_cp}" in report.failures[0].reason


def test_runclosed_removed_is_named(run: Recorded) -> None:
    closed = run.seq_of("RunClosed")
    run.attacker.delete(run.run_id, closed + 1)
    report = run.replay()
    assert_named(report, "sequence", closed + 1)  # the final checkpoint now follows a gap
    assert_named(report, "closed", closed + 2)


def test_runclosed_and_final_checkpoint_removed_is_named(run: Recorded) -> None:
    closed = run.seq_of("RunClosed")
    run.attacker.delete_from(run.run_id, closed + 1)
    report = run.replay()
    assert_named(report, "closed", closed)
    assert report.failed_checks() == ["closed"]


def test_unknown_run_is_not_found(run: Recorded, tmp_path: Path) -> None:
    from holedger.errors import NotFoundError

    with pytest.raises(NotFoundError):
        replay_run(run.ledger, "00000000-0000-4000-8000-000000000000", checks=())
