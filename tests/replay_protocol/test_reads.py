"""The optimizer's reads: a validly signed OptimizerRead naming anything the optimizer was
not shown fails ``reads_disclosed`` (a leakage failure); honest reads and a log without
any read event verify."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from holedger.ledger.records import utc_now
from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.replay.report import ReplayReport
from holedger.schemas.events import OptimizerRead, ReadItem

from .runs import DEV, TEST, RunWriter, checks, failures_of, honest_finish, terms

SEED = "a" * 40
CAND = "b" * 40
OTHER = "c" * 40


def _read(kind: str, after_seq: int, **fields: Any) -> ReadItem:
    return ReadItem(kind=kind, after_seq=after_seq, time=utc_now(), **fields)  # type: ignore[arg-type]


def _search(ledger: Ledger) -> tuple[RunWriter, int, str]:
    """Seed and candidate committed, one dev evaluation: (writer, its last seq, a blob it
    disclosed)."""
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    writer.commit(SEED)
    writer.commit(CAND)
    rid = writer.evaluate(CAND, "dev", [c.id for c in DEV], 1)
    proj = next(r for r in ledger.records(writer.run_id) if r.type == "DisclosureProjected")
    assert proj.payload["request_id"] == rid
    digest = sorted(rules.fetchable_roles(proj.payload["projection"]))[0]
    return writer, proj.seq, digest


def _reads(writer: RunWriter, *items: ReadItem) -> int:
    return writer.append("OptimizerRead", OptimizerRead(reads=list(items)))


def _failed_only(report: ReplayReport, name: str) -> list[str]:
    assert not report.verified
    assert {n for n, ok in checks(report).items() if not ok} == {name}, report.failures
    return failures_of(report, name)


def test_honest_reads_verify_and_are_counted(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, at, digest = _search(ledger)
    _reads(
        writer,
        _read("run", at),
        _read("budget", at),
        _read("tree", at, candidate=SEED, contents=True),
        _read("file", at, candidate=CAND, path="harness/__main__.py"),
        _read("blob", at, digest=digest, role="answer"),
    )
    _reads(
        writer,
        _read("blob", at, digest=digest, role="answer"),
        _read("evaluations", at),
        _read("projection", at, request_id="req-1"),
    )
    honest_finish(writer, CAND)
    report = replay(writer.run_id)
    assert report.verified, report.failures
    assert checks(report)["reads_disclosed"]
    section = report.sections["reads"]
    assert section["batches"] == 2 and section["reads"] == 8
    assert section["by_kind"] == {
        "blob": 2,
        "budget": 1,
        "evaluations": 1,
        "file": 1,
        "projection": 1,
        "run": 1,
        "tree": 1,
    }
    assert section["blobs_by_role"] == {"answer": 2}


def test_a_log_without_read_events_verifies_and_says_so(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, _, _ = _search(ledger)
    honest_finish(writer, CAND)
    report = replay(writer.run_id)
    assert report.verified
    detail = next(c.detail for c in report.checks if c.name == "reads_disclosed")
    assert "no read events recorded" in detail
    assert report.sections["reads"]["recorded"] is False


def test_fetching_a_heldout_answer_is_a_leakage_failure(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, _, _ = _search(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    test_trial = next(
        r for r in ledger.records(writer.run_id) if r.payload.get("case_id") == TEST[0].id
    )
    secret = test_trial.payload["answer_digest"]
    last = max(r.seq for r in ledger.records(writer.run_id))
    seq = _reads(writer, _read("blob", last, digest=secret, role="answer"))
    writer.scored(CAND)
    writer.close()
    failures = _failed_only(replay(writer.run_id), "reads_disclosed")
    assert failures == [
        f"{seq}:OptimizerRead:leakage: the optimizer fetched blob {secret[:16]}, which no "
        f"projection had disclosed to it by seq {last}"
    ]


def test_a_blob_read_answered_before_its_disclosure_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, at, digest = _search(ledger)
    seq = _reads(writer, _read("blob", at - 1, digest=digest, role="answer"))
    honest_finish(writer, CAND)
    failures = _failed_only(replay(writer.run_id), "reads_disclosed")
    assert len(failures) == 1 and failures[0].startswith(f"{seq}:OptimizerRead:leakage: ")
    assert f"by seq {at - 1}" in failures[0]


def test_a_blob_read_in_the_wrong_role_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, at, digest = _search(ledger)
    _reads(writer, _read("blob", at, digest=digest, role="trace"))
    honest_finish(writer, CAND)
    (failure,) = _failed_only(replay(writer.run_id), "reads_disclosed")
    assert "recorded as a trace read; its projection disclosed it as an answer" in failure


def test_reading_a_projection_not_yet_recorded_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, at, _ = _search(ledger)
    early = _reads(writer, _read("projection", at - 1, request_id="req-1"))
    never = _reads(writer, _read("projection", at, request_id="req-9"))
    honest_finish(writer, CAND)
    assert _failed_only(replay(writer.run_id), "reads_disclosed") == [
        f"{early}:OptimizerRead:leakage: the optimizer read the projection of request req-1, "
        f"which was not recorded by seq {at - 1}",
        f"{never}:OptimizerRead:leakage: the optimizer read the projection of request req-9, "
        f"which was not recorded by seq {at}",
    ]


def test_reading_an_uncommitted_candidate_or_from_the_future_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer, at, _ = _search(ledger)
    first = _reads(writer, _read("file", at, candidate=OTHER, path="harness/__main__.py"))
    second = _reads(writer, _read("run", first + 5))
    honest_finish(writer, CAND)
    failures = _failed_only(replay(writer.run_id), "reads_disclosed")
    assert failures == [
        f"{first}:OptimizerRead:leakage: the optimizer read the file of {OTHER[:12]}, which "
        f"was not a committed candidate at seq {at}",
        f"{second}:OptimizerRead:leakage: a run read answered from seq {first + 5}, not "
        f"before its record at seq {second}",
    ]
