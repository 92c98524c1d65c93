"""Replay's chunk path gives exactly the report of the record-by-record reference pass.

``verify_records`` checks records a chunk at a time (replay/chunks.py), in this process
or in worker processes, and falls back to the reference pass for any chunk with anything
wrong in it. Here every run, intact or damaged, is replayed four ways: the reference pass
alone (``fast=False``), chunks in one process, chunks in two processes, and chunks in two
processes with every chunk sent to the worker; the reports must be equal, field by field.

Damage comes two ways: bytes changed by someone without the key (flips, deletions, swaps,
truncations, foreign events), and runs rewritten by someone *with* the key, re-signed
and re-chained so that every signature verifies: a wrong checkpoint root, a checkpoint
note for another run or size, signed by another key, a checkpoint by the wrong role, a
second RunClosed, events after RunClosed, a RunOpened in the middle, a seq gap, missing
and altered blobs. Those reach the branches of the chunk check that a flipped byte never
does (a bad signature fails a chunk before anything else is looked at).
"""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Callable
from typing import Any

import pytest
from ledger.attacker import flip
from ledger.recorded_run import MemoryBlobs as Blobs
from ledger.recorded_run import record_run

from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import sign_envelope
from holedger.ledger.store import Ledger
from holedger.replay import chunks, parallel
from holedger.replay.report import ReplayReport
from holedger.replay.runs import LedgerBlobs, verify_records
from holedger.schemas.canonical import canonical_json
from holedger.schemas.types import ZERO_HASH
from replay.worker_jobs import count_worker_jobs

KEY = SigningKey.generate("holedger-operator")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[bytes], Blobs, str]:
    """A recorded run (records and blobs in memory) and a second run's id."""
    url = f"sqlite:///{tmp_path_factory.mktemp('chunks') / 'ledger.db'}"
    ledger = Ledger.open(url, KEY, checkpoint_interval=16)
    run_id = record_run(ledger, rounds=5)
    other = record_run(ledger, rounds=1, task_id="other-task")
    records = [raw for _, raw in ledger.raw_records(run_id)]
    found: dict[str, bytes] = {}
    for raw in records + [raw for _, raw in ledger.raw_records(other)]:
        for name, value in parse_record(raw).payload.items():
            if name.endswith("_digest") and isinstance(value, str) and ledger.has_blob(value):
                found[value] = ledger.get_blob(value)
    blobs = Blobs(found)
    # The in-memory blobs are the ledger's own: the same report either way.
    assert verify_records(run_id, records, LedgerBlobs(ledger), checks=()).verified
    ledger.close()
    return run_id, records, blobs, other


def replays(
    run_id: str,
    records: list[bytes],
    blobs: Blobs,
    monkeypatch: pytest.MonkeyPatch,
    workers: bool = True,
    **kw: Any,
) -> ReplayReport:
    """Replay four ways (two without ``workers``); assert the reports are equal; return
    the reference report."""
    kw.setdefault("checks", ())
    reference = verify_records(run_id, records, blobs, fast=False, **kw)
    # Chunks of 7 records: chunk edges fall everywhere, and a checkpoint every 16 events
    # lands at every offset in a chunk over a run.
    monkeypatch.setattr(parallel, "CHUNK", 7)
    monkeypatch.setattr(parallel, "LOCAL_CHUNK", 7)
    checked: list[chunks.ChunkJob] = []  # the chunks that get a chunk check at all

    def check(job: chunks.ChunkJob) -> chunks.ChunkSummary | None:
        checked.append(job)
        return chunks.check_chunk(job)

    monkeypatch.setattr(parallel, "check_chunk", check)
    reports = {"one process": verify_records(run_id, records, blobs, **kw)}
    monkeypatch.setattr(parallel, "check_chunk", chunks.check_chunk)
    if workers:
        reports["two"] = verify_records(run_id, records, blobs, workers=2, **kw)
        # Nearly every chunk to the worker: one goes while it has fewer than 64 waiting
        # (and fits the pipe; a limit so large that nothing fits would send none).
        monkeypatch.setattr(parallel, "WAITING_PER_WORKER", 64)
        sent = count_worker_jobs(monkeypatch)
        reports["mostly in the worker"] = verify_records(run_id, records, blobs, workers=2, **kw)
        assert len(sent) >= len(checked) // 2, f"{len(sent)} of {len(checked)} in the worker"
    monkeypatch.undo()
    for name, report in reports.items():
        assert report.to_json() == reference.to_json(), name
        assert report == reference, name
    return reference


def resign(
    records: list[bytes],
    key: SigningKey = KEY,
    edit: Callable[[int, dict[str, Any]], dict[str, Any] | None] | None = None,
    recompute_checkpoints: bool = True,
) -> list[bytes]:
    """Rewrite a run as its key holder could: ``edit(index, envelope)`` may change an
    envelope (or drop the event: None; or set ``_prev_hash`` to break the chain there);
    everything is re-signed and re-chained, and each checkpoint recomputed over what
    precedes it (unless ``recompute_checkpoints`` is off)."""
    out: list[bytes] = []
    prev = ZERO_HASH
    frontier = MerkleFrontier()
    for index, raw in enumerate(records):
        rec = parse_record(raw)
        envelope = dict(rec.envelope, payload=dict(rec.payload))
        if rec.type == "Checkpoint" and recompute_checkpoints:
            root = frontier.root()
            body = checkpoint_body(f"holedger/run/{rec.run_id}", frontier.size, root)
            envelope["payload"] = {
                "size": frontier.size,
                "root": root.hex(),
                "note": sign_note(body, key),
            }
        edited = edit(index, envelope) if edit else envelope
        if edited is None:
            continue
        edited = dict(edited, prev_hash=edited.pop("_prev_hash", prev), key_id=key.key_id_hex)
        forged = sign_envelope(key, edited, canonical_json(edited))
        out.append(forged.raw)
        prev = hashlib.sha256(forged.signed).hexdigest()
        frontier.append(forged.leaf_hash)
    return out


def first_of(records: list[bytes], event_type: str, after: int = 1) -> int:
    return next(
        i for i, raw in enumerate(records) if i >= after and parse_record(raw).type == event_type
    )


# ---------------------------------------------------------------------------- intact


def test_intact_run_verifies_every_way(stored: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, records, blobs, _ = stored
    report = replays(run_id, records, blobs, monkeypatch)
    assert report.verified and report.events == len(records)


def test_intact_run_with_every_check_gives_the_same_report(
    stored: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, records, blobs, _ = stored
    report = replays(run_id, records, blobs, monkeypatch, checks=None)
    assert {c["name"] for c in report.to_json()["checks"]} >= {"budget", "scores", "disclosure"}


def test_pinned_key_and_wrong_pinned_key(stored: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, records, blobs, _ = stored
    assert replays(run_id, records, blobs, monkeypatch, trusted_keys=[KEY.public]).verified
    other = SigningKey.generate("holedger-operator").public
    assert not replays(run_id, records, blobs, monkeypatch, trusted_keys=[other]).verified


def test_rewritten_under_another_key_passes_only_unpinned(
    stored: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole run re-signed by an impostor verifies on its own declarations (keys taken
    on trust) and fails at once against the operator's pinned key, every way."""
    run_id, records, blobs, _ = stored
    impostor = SigningKey.generate("holedger-operator")

    def declare(index: int, env: dict[str, Any]) -> dict[str, Any]:
        if env["type"] == "RunOpened":
            info = {
                "name": impostor.name,
                "key_id": impostor.key_id_hex,
                "public_key": base64.b64encode(impostor.public.raw).decode(),
            }
            env["payload"]["keys"] = {role: info for role in env["payload"]["keys"]}
        return env

    forged = resign(records, impostor, declare)
    assert replays(run_id, forged, blobs, monkeypatch).verified
    pinned = replays(run_id, forged, blobs, monkeypatch, trusted_keys=[KEY.public])
    assert not pinned.verified and pinned.failures[0].seq == 0


# ---------------------------------------------------------------------------- without the key


def test_a_flipped_byte_anywhere_in_every_event(
    stored: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, records, blobs, _ = stored
    rng = random.Random(9162)
    for index, raw in enumerate(records):
        damaged = list(records)
        damaged[index] = flip(raw, rng.randrange(len(raw)))
        # with workers too for every fifth event (the worker runs the same chunk check)
        report = replays(run_id, damaged, blobs, monkeypatch, workers=index % 5 == 0)
        assert not report.verified, index


@pytest.mark.parametrize(
    "damage",
    [
        "deleted",
        "swapped",
        "duplicated",
        "truncated",
        "no RunClosed",
        "no first record",
        "garbage record",
        "foreign event",
        "empty",
    ],
)
def test_damage_without_the_key(stored: Any, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, records, blobs, other = stored
    damaged = list(records)
    middle = len(records) // 2
    if damage == "deleted":
        del damaged[middle]
    elif damage == "swapped":
        damaged[middle], damaged[middle + 1] = damaged[middle + 1], damaged[middle]
    elif damage == "duplicated":
        damaged.insert(middle, damaged[middle])
    elif damage == "truncated":
        damaged = damaged[: middle + 3]
    elif damage == "no RunClosed":
        del damaged[first_of(records, "RunClosed")]
    elif damage == "no first record":
        damaged = damaged[1:]
    elif damage == "garbage record":
        damaged[middle] = b"not a record"
    elif damage == "foreign event":
        damaged[middle] = parse_record(records[middle]).raw.replace(run_id.encode(), other.encode())
    elif damage == "empty":
        damaged = []
    report = replays(run_id, damaged, blobs, monkeypatch)
    assert not report.verified


@pytest.mark.parametrize("field", ["output_digest", "request_digest", "evidence_digest"])
def test_missing_and_altered_blobs(
    stored: Any, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob of each kind (a trial's, a gateway call's, a safety violation's) missing or
    altered, with and without the checks (which must stop where the reference pass's
    do: before the event whose blob failed)."""
    run_id, records, blobs, _ = stored
    named = [parse_record(raw).payload.get(field) for raw in records]
    digests = [d for d in named if isinstance(d, str)]
    assert digests, f"the recorded run names no {field}"
    digest = digests[len(digests) // 2]
    missing = Blobs({d: b for d, b in blobs.blobs.items() if d != digest})
    altered = Blobs(dict(blobs.blobs, **{digest: b"something else"}))
    for damaged in (missing, altered):
        for checks in ((), None):
            report = replays(run_id, records, damaged, monkeypatch, checks=checks)
            assert "blobs" in report.failed_checks()
            first = next(f for f in report.failures if f.check == "blobs")
            assert first.seq == named.index(digest)
            seqs = [f.seq for f in report.failures]
            assert seqs == sorted(seqs, key=lambda seq: (seq is None, seq or 0))


# ---------------------------------------------------------------------------- with the key


def _set_payload(
    event_type: str, nth: int, **changes: Any
) -> Callable[[int, dict[str, Any]], dict[str, Any]]:
    seen = {"n": 0}

    def edit(index: int, env: dict[str, Any]) -> dict[str, Any]:
        if env["type"] == event_type:
            if seen["n"] == nth:
                env["payload"].update(changes)
            seen["n"] += 1
        return env

    return edit


def _note(run_id: str, size: int, root: bytes, key: SigningKey = KEY) -> str:
    return sign_note(checkpoint_body(f"holedger/run/{run_id}", size, root), key)


CHECKPOINT_DAMAGE: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "wrong root": lambda run, p: p.update(root="00" * 32),
    "note for another size": lambda run, p: p.update(
        note=_note(run, p["size"] + 1, bytes.fromhex(p["root"]))
    ),
    "note for another run": lambda run, p: p.update(
        note=_note("0" * 8 + run[8:], p["size"], bytes.fromhex(p["root"]))
    ),
    "note by another key": lambda run, p: p.update(
        note=_note(
            run, p["size"], bytes.fromhex(p["root"]), SigningKey.generate("holedger-operator")
        )
    ),
    "size not its seq": lambda run, p: p.update(
        size=p["size"] - 1, note=_note(run, p["size"] - 1, bytes.fromhex(p["root"]))
    ),
    "note not a note": lambda run, p: p.update(note="not a note\n"),
    # no character to escape: the payload is one the record pattern could match
    "note on one line": lambda run, p: p.update(note="a note on one line"),
}


@pytest.mark.parametrize("damage", sorted(CHECKPOINT_DAMAGE))
@pytest.mark.parametrize("nth", [0, 3, -1])
def test_resigned_checkpoint_damage(
    stored: Any, damage: str, nth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, records, blobs, _ = stored
    count = sum(1 for raw in records if parse_record(raw).type == "Checkpoint")
    target = nth % count
    seen = {"n": 0}

    def edit(index: int, env: dict[str, Any]) -> dict[str, Any]:
        if env["type"] == "Checkpoint":
            if seen["n"] == target:
                CHECKPOINT_DAMAGE[damage](run_id, env["payload"])
            seen["n"] += 1
        return env

    report = replays(run_id, resign(records, edit=edit), blobs, monkeypatch)
    assert not report.verified
    assert "checkpoints" in report.failed_checks() or "closed" in report.failed_checks()


def test_resigned_checkpoint_by_the_wrong_role(
    stored: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, records, blobs, _ = stored
    at = first_of(records, "Checkpoint")

    def edit(index: int, env: dict[str, Any]) -> dict[str, Any]:
        if index == at:
            env["role"] = "gateway"
        return env

    report = replays(run_id, resign(records, edit=edit), blobs, monkeypatch)
    assert "checkpoints" in report.failed_checks()


PROTOCOL_DAMAGE = [
    "second RunClosed",
    "event after RunClosed",
    "RunOpened in the middle",
    "seq gap",
    "seq repeated",
    "chain broken",
    "event of another run",
    "unknown type",
    "unknown schema version",
    "invalid payload",
    "a boolean for an integer",
    "an integer as a string",
    "blob digest unknown",
    "role without a key",
]


# Where the damage sits in its chunk matters to these: every offset in a chunk of 7.
AT_EVERY_OFFSET = {"seq gap", "seq repeated", "chain broken", "second RunClosed"}


@pytest.mark.parametrize(
    ("damage", "shift"),
    [(d, shift) for d in PROTOCOL_DAMAGE for shift in (range(7) if d in AT_EVERY_OFFSET else [3])],
)
def test_resigned_protocol_damage(
    stored: Any, damage: str, shift: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, records, blobs, _ = stored
    closed = first_of(records, "RunClosed")
    middle = len(records) // 2 + shift
    call = first_of(records, "GatewayCall", middle)

    def edit(index: int, env: dict[str, Any]) -> dict[str, Any] | None:
        if damage == "second RunClosed" and index == middle:
            env.update(type="RunClosed", payload={"reason": "again", "summary": {}})
        elif damage == "event after RunClosed" and index == closed:
            env.update(type="CandidateNominated", payload={"candidate": "0" * 40})
        elif damage == "RunOpened in the middle" and index == middle:
            env.update(type="RunOpened", payload=parse_record(records[0]).payload)
        elif damage == "seq gap" and index >= middle:
            env["seq"] += 1
        elif damage == "seq repeated" and index >= middle:
            env["seq"] -= 1
        elif damage == "chain broken" and index == middle:
            env["_prev_hash"] = "cd" * 32
        elif damage == "event of another run" and index == middle:
            env["run_id"] = "0" * 8 + run_id[8:]
        elif damage == "unknown type" and index == call:
            env["type"] = "GatewayCalls"
        elif damage == "unknown schema version" and index == call:
            env["schema_version"] = 2
        elif damage == "invalid payload" and index == call:
            env["payload"]["status"] = "two hundred"
        elif damage == "a boolean for an integer" and index == call:
            env["payload"]["latency_ms"] = False  # would read as 0 where converted
        elif damage == "an integer as a string" and index == call:
            env["payload"]["status"] = str(env["payload"]["status"])
        elif damage == "blob digest unknown" and index == call:
            env["payload"]["request_digest"] = "ab" * 32
        elif damage == "role without a key" and index == 0:
            del env["payload"]["keys"]["sandbox"]  # the run's SafetyViolation is the sandbox's
        return env

    report = replays(run_id, resign(records, edit=edit), blobs, monkeypatch)
    assert not report.verified, damage
    if damage.startswith(("a boolean", "an integer")):
        first = report.failures[0]
        assert (first.seq, first.check) == (call, "schema"), first


def test_chunk_check_names_nothing_and_decides_whole_chunks(stored: Any) -> None:
    """check_chunk itself: a summary for a clean chunk, None for each kind of trouble."""
    run_id, records, _, _ = stored
    opened = parse_record(records[0]).payload["keys"]
    keys = tuple(
        sorted(
            (role, info["name"], base64.b64decode(info["public_key"]))
            for role, info in opened.items()
        )
    )
    clean = records[1:40]
    summary = chunks.check_chunk(chunks.ChunkJob(run_id, keys, clean))
    assert summary is not None and summary.first_seq == 1 and len(summary.leaves) == 32 * 39
    assert summary.first_prev == parse_record(records[1]).prev_hash
    assert summary.last_hash == parse_record(records[39]).event_hash
    assert [
        leaf for leaf in (summary.leaves[i : i + 32] for i in range(0, len(summary.leaves), 32))
    ] == [parse_record(raw).leaf_hash for raw in clean]
    broken = list(clean)
    broken[5] = flip(broken[5], len(broken[5]) - 60)
    for job in (
        chunks.ChunkJob(run_id, keys, broken),
        chunks.ChunkJob(run_id, keys, records[0:10]),  # RunOpened
        chunks.ChunkJob(run_id, (), clean),  # no keys
        chunks.ChunkJob(run_id, keys, clean[:3] + clean[4:]),  # a gap
        chunks.ChunkJob(run_id, keys, []),
    ):
        assert chunks.check_chunk(job) is None
