"""Replay with signature verification in worker processes gives the very same report."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from ledger.attacker import Row, flip, forge_signature, resign_run
from ledger.recorded_run import record_run

from holedger.errors import HoledgerError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay import parallel
from holedger.replay.report import ReplayReport
from holedger.replay.runs import LedgerBlobs, replay_run, verify_records
from replay.worker_jobs import count_worker_jobs


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ledger, str, list[bytes]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('parallel') / 'ledger.db'}"
    ledger = Ledger.open(url, SigningKey.generate("holedger-operator"), checkpoint_interval=32)
    run_id = record_run(ledger, rounds=4)
    return ledger, run_id, [raw for _, raw in ledger.raw_records(run_id)]


def _both(
    ledger: Ledger, run_id: str, records: list[bytes], monkeypatch: pytest.MonkeyPatch, **kw: object
) -> tuple[ReplayReport, ReplayReport]:
    # chunks go to workers once the run is open (in these variants: when it starts with a
    # RunOpened)
    opens = bool(records) and records[0].endswith(b'"type":"RunOpened"}')
    monkeypatch.setattr(parallel, "CHUNK", 7)  # many chunks, so ordering across them counts
    monkeypatch.setattr(parallel, "LOCAL_CHUNK", 7)
    blobs = LedgerBlobs(ledger)
    one = verify_records(run_id, records, blobs, checks=(), **kw)  # type: ignore[arg-type]
    two = verify_records(run_id, records, blobs, checks=(), workers=2, **kw)  # type: ignore[arg-type]
    # Every chunk verified here, and nearly every chunk sent to the worker: the same
    # report too.
    for waiting in (0, 64):
        monkeypatch.setattr(parallel, "WAITING_PER_WORKER", waiting)
        sent = count_worker_jobs(monkeypatch)
        again = verify_records(run_id, records, blobs, checks=(), workers=2, **kw)  # type: ignore[arg-type]
        assert again == two
        assert bool(sent) == (waiting > 0 and opens)
    return one, two


def test_intact_run(
    stored: tuple[Ledger, str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, run_id, records = stored
    one, two = _both(ledger, run_id, records, monkeypatch)
    assert one.verified and one == two


def test_tampered_runs(
    stored: tuple[Ledger, str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, run_id, records = stored
    sig_flip = list(records)
    sig_flip[9] = flip(records[9], records[9].rindex(b',"sig":"') + 12)
    garbage = list(records)
    garbage[3] = b"not json"
    swapped = list(records)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    for variant in (sig_flip, garbage, swapped, records[1:], records[:40]):
        one, two = _both(ledger, run_id, variant, monkeypatch)
        assert not one.verified
        assert one == two


def test_resigned_run_with_pinned_key(
    stored: tuple[Ledger, str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, run_id, records = stored
    rows = [Row(i, i + 1, parse_record(r).type, r) for i, r in enumerate(records)]
    forged = resign_run(rows, SigningKey.generate("holedger-operator"))
    pinned = [ledger.signers["server"].public]
    one, two = _both(ledger, run_id, forged, monkeypatch, trusted_keys=pinned)
    assert not one.verified and one == two


def test_replay_run_accepts_workers(
    stored: tuple[Ledger, str, list[bytes]], tmp_path: Path
) -> None:
    ledger, run_id, _ = stored
    assert replay_run(ledger, run_id, checks=(), workers=2).verified


def test_worker_processes_are_kept_and_replaced_when_gone(
    stored: tuple[Ledger, str, list[bytes]],
) -> None:
    ledger, run_id, _ = stored
    assert replay_run(ledger, run_id, checks=(), workers=2).verified
    (worker,) = parallel._POOL.workers
    assert replay_run(ledger, run_id, checks=(), workers=2).verified
    assert parallel._POOL.workers == [worker]  # the same process, reused
    worker.process.kill()
    worker.process.wait()
    assert replay_run(ledger, run_id, checks=(), workers=2).verified
    assert parallel._POOL.workers and parallel._POOL.workers[0] is not worker


def test_a_worker_that_dies_is_an_error_not_a_hang() -> None:
    worker = parallel._Worker()
    worker.process.kill()
    worker.process.wait()
    worker.waiting = 1
    with pytest.raises(HoledgerError, match="replay worker process ended"):
        worker.receive()
    worker.close()


def test_replays_in_two_threads_at_once(stored: tuple[Ledger, str, list[bytes]]) -> None:
    """One replay takes the kept workers; one started meanwhile starts its own."""
    ledger, run_id, records = stored
    blobs = LedgerBlobs(ledger)
    reference = verify_records(run_id, records, blobs, checks=(), fast=False)
    reports: list[ReplayReport] = []

    def replay() -> None:
        reports.append(verify_records(run_id, records, blobs, checks=(), workers=2))

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert reports == [reference, reference]


def test_chunks_keep_order_and_limits() -> None:
    rng = random.Random(7)
    for _ in range(500):
        records = [bytes(rng.randint(1, 40)) for _ in range(rng.randint(0, 60))]
        count, size = rng.randint(1, 9), rng.randint(1, 120)
        chunks = list(parallel._chunks(records, count, size))
        assert [raw for chunk in chunks for raw in chunk] == records
        for chunk in chunks:
            assert chunk and len(chunk) <= count
            assert len(chunk) == 1 or sum(map(len, chunk)) <= size


@pytest.mark.parametrize(
    "planted", ["holedger/__init__.py", "pickle.py", "cryptography/__init__.py"]
)
def test_a_module_planted_where_replay_runs_is_not_imported_by_workers(
    stored: tuple[Ledger, str, list[bytes]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    planted: str,
) -> None:
    """Replay run from a directory someone else can write to: the worker processes import
    the code this process runs, never a module planted there (which could approve every
    chunk it is sent), and a forged signature is still reported."""
    ledger, run_id, records = stored
    marker = tmp_path / "planted code ran"
    where = tmp_path / "cwd"
    (where / planted).parent.mkdir(parents=True)
    (where / planted).write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted module imported')\n"
    )
    forged = list(records)
    forged[9] = forge_signature(records[9])
    parallel._POOL.discard()  # the workers start from the planted directory
    monkeypatch.chdir(where)
    monkeypatch.setattr(parallel, "CHUNK", 7)
    monkeypatch.setattr(parallel, "WAITING_PER_WORKER", 64)
    sent = count_worker_jobs(monkeypatch)
    try:
        report = verify_records(run_id, forged, LedgerBlobs(ledger), checks=(), workers=2)
    finally:
        parallel._POOL.discard()
    assert not marker.exists()
    assert sent
    assert not report.verified
    assert (report.failures[0].seq, report.failures[0].type) == (9, parse_record(records[9]).type)
