"""A hand-written honest run verifies, and its report carries the re-derived tables."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest

from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport
from holedger.schemas.canonical import rational_to_str

from .runs import (
    DEV,
    E_H0,
    TEST,
    VAL,
    K,
    RunWriter,
    checks,
    honest_finish,
    honest_search,
    score_of,
    terms,
)

SEED = "a" * 40
CAND = "b" * 40

OUR_CHECKS = (
    "budget",
    "disclosure",
    "scores",
    "leakage",
    "candidate_scan",
    "candidates_committed",
    "test_split_sealed",
    "nomination",
    "trials_match_requests",
)


def test_honest_run_verifies_with_every_protocol_check(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    report = replay(writer.run_id)
    assert report.verified, report.failures
    ok = checks(report)
    for name in OUR_CHECKS:
        assert ok[name], name


def test_budget_table_matches_an_independent_count(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    table = {row["component"]: row for row in replay(writer.run_id).sections["budget_table"]}
    # independent count: dev 2 cases x 2 + 4 cases x 1 over 4 cases, val 5 of 6 once
    assert table["dev calls"]["used"] == "2"
    assert table["dev case_passes"]["used"] == rational_to_str(Fraction(2 * 2 + 4, 4))
    assert table["val calls"]["used"] == "1"
    assert table["val case_passes"]["used"] == "5/6"
    assert table["dev calls"]["percent"] == "50.0%"
    assert table["val case_passes"]["percent"] == "41.7%"
    assert table["dev calls"]["limit"] == "4"


def test_scores_section_reports_gain_and_band(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    report = replay(writer.run_id)
    scores = report.sections["scores"]
    # E(H0) is not recomputed here: the check says where it comes from.
    assert scores["e_h0_source"] == "pinned seed baseline"
    [detail] = [c.detail for c in report.checks if c.name == "scores"]
    assert f"recomputed from {len(TEST)} cases x K; E(H0) 0.333 as pinned" in detail
    per_case = [sum(score_of(CAND, c.id, a) for a in range(K)) / K for c in TEST]
    e_plus = sum(per_case, Fraction(0)) / len(TEST)
    g = (e_plus - E_H0) / (1 - E_H0)
    assert scores["e_h_plus"] == rational_to_str(e_plus)
    assert scores["e_h0"] == "1/3"
    assert scores["g"] == rational_to_str(g)
    # CAND's per-case means 1/4, 1/4, 1/4, 3/4: E(H+) = 3/8, g = (3/8 - 1/3) / (2/3) = 1/16
    assert g == Fraction(1, 16)
    assert scores["band_outcome"] == "resolved gain"  # 1/16 > 1/20
    assert scores["cases"] == len(TEST)


@pytest.mark.parametrize(
    ("candidate", "band", "outcome"),
    [
        # "d": per-case means 0, 1/2, 3/4, 0; E(H+) = 5/16; g = (5/16 - 1/3) / (2/3) = -1/32
        ("d" * 40, Fraction(1, 64), "resolved loss"),  # g < -b
        ("d" * 40, Fraction(1, 32), "indistinguishable from 0"),  # |g| = b: the boundary
        ("d" * 40, Fraction(1, 20), "indistinguishable from 0"),  # |g| < b, g < 0
        # "1": per-case means 0, 3/4, 1/2, 1/4; E(H+) = 3/8; g = 1/16
        ("1" * 40, Fraction(1, 20), "resolved gain"),  # g > b
        ("1" * 40, Fraction(1, 16), "indistinguishable from 0"),  # g = b: the boundary
        ("1" * 40, Fraction(1, 10), "indistinguishable from 0"),  # 0 < g < b
    ],
)
def test_replay_says_which_of_a5s_three_outcomes_g_has(
    ledger: Ledger,
    replay: Callable[..., ReplayReport],
    candidate: str,
    band: Fraction,
    outcome: str,
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED).model_copy(update={"resolution_band": band}))
    honest_search(writer, SEED, candidate)
    honest_finish(writer, candidate)
    report = replay(writer.run_id)
    assert report.verified, report.failures
    scores = report.sections["scores"]
    assert (scores["g"], scores["resolution_band"]) == (
        rational_to_str(Fraction(-1, 32) if candidate[0] == "d" else Fraction(1, 16)),
        rational_to_str(band),
    )
    assert scores["band_outcome"] == outcome


def test_leakage_audit_lists_every_projection_by_digest(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    leakage = replay(writer.run_id).sections["leakage"]
    assert leakage["audit"]["status"] == "done"
    assert leakage["audit"]["findings"] == []
    assert len(leakage["shown"]) == 3
    assert {s["split"] for s in leakage["shown"]} == {"dev", "val"}
    # dev projections name their answer blobs, which the audit also read
    assert all(len(s["blobs"]) > 0 for s in leakage["shown"] if s["split"] == "dev")
    # no repository given: the scan says so plainly, and that is not a failure
    assert leakage["candidate_scan"]["status"] == "skipped"


def test_run_without_nomination_is_reported_unscored(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    writer.close()
    report = replay(writer.run_id)
    assert report.verified, report.failures
    detail = {c.name: c.detail for c in report.checks}
    assert "unscored" in detail["nomination"]
    assert report.sections["scores"] == {"scored": False}


def test_rejections_the_rules_demand_are_right(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED, dev_calls=1))
    writer.commit(SEED)
    writer.evaluate(SEED, "dev", [DEV[0].id], 1)
    _, _ = writer.request(SEED, "dev", [DEV[1].id], 1)  # calls exhausted: rejected
    _, _ = writer.request(SEED, "test", [c.id for c in TEST], K)  # sealed: rejected
    _, _ = writer.request(SEED, "val", [VAL[0].id, VAL[0].id], 1)  # duplicate: rejected
    _, _ = writer.request(
        "c" * 40, "val", [v.id for v in VAL[:5]], 1, decision="rejected", reason="unknown candidate"
    )
    writer.close()
    report = replay(writer.run_id)
    assert report.verified, report.failures
    assert "4 rejected" in {c.name: c.detail for c in report.checks}["budget"]


@pytest.mark.parametrize("where", ["middle", "before the first trial"])
def test_after_a_break_every_later_judgement_says_it_covers_the_intact_part_only(
    ledger: Ledger,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A run broken at seq N: the budget, protocol, isolation and score checks were judged
    on seq 0 to N - 1 only, and each of them (and each failure they add, and each line
    printed from what they found) says so; the integrity checks and their failures are
    stated as they are. The failures are listed in the order of the log."""
    from ledger.attacker import forge_signature

    from holedger.ledger.fastpath import parse_record
    from holedger.replay.engine import CHECKS
    from holedger.replay.inputs import CheckInputs
    from holedger.replay.runs import LedgerBlobs, verify_records

    from .runs import task_data

    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    records = [raw for _, raw in ledger.raw_records(writer.run_id)]
    inputs = CheckInputs(task_data=task_data())
    intact = verify_records(writer.run_id, records, LedgerBlobs(ledger), inputs=inputs)
    assert intact.verified and not any("[judged" in c.detail for c in intact.checks)
    types = [parse_record(raw).type for raw in records]
    at = len(records) // 2 if where == "middle" else types.index("TrialCompleted")
    records[at] = forge_signature(records[at])
    report = verify_records(writer.run_id, records, LedgerBlobs(ledger), inputs=inputs)
    integrity = {name for name, _ in CHECKS}
    # Not about the log's content, so not limited to its intact part either.
    assert next(c.detail for c in report.checks if c.name == "keys_pinned").startswith("no ")
    integrity |= {"keys_pinned"}
    broken = [f for f in report.failures if f.check in integrity]
    assert (broken[0].seq, broken[0].type, broken[0].check) == (at, types[at], "signatures")
    assert not broken[0].reason.startswith("[")
    seqs = [f.seq for f in report.failures]
    assert seqs == sorted(seqs, key=lambda seq: (seq is None, seq or 0)), report.failures
    # What the events past the break would have completed (a request's trials, its
    # projection, the score) is not called missing: the first failure is the break.
    assert report.failures[0] == broken[0], report.failures
    assert not any(
        "never recorded" in f.reason
        or "has no projection" in f.reason
        or "never scored" in f.reason
        for f in report.failures
    ), report.failures
    details = {c.name: c.detail for c in report.checks}
    assert "lie past the break: not judged" in details["trials_match_requests"]
    later = [c for c in report.checks if c.name not in integrity]
    assert {c.name for c in later} >= {*OUR_CHECKS, "isolation"}
    judged = f"[judged on seq 0 to {at - 1} only, where the log is intact]"
    for check in later:
        assert check.detail.startswith(judged), check
    for failure in report.failures:
        assert failure.reason.startswith("[judged") == (failure.check not in integrity)
    # The terminal shows the same words: a bracket in a detail is text, not a style tag;
    # the lines printed from the sections (scores, leakage, safety) carry them too.
    from holedger.replay.commands import print_report

    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    print_report(report)
    shown = capsys.readouterr().out
    assert shown.count(judged) >= len(later), shown
    lines = shown.splitlines()
    for name in ("leakage audit", "leakage candidate scan", "safety"):
        assert any(line.startswith(f"{name}: {judged} ") for line in lines), (name, shown)
    if report.sections.get("scores", {}).get("scored"):
        assert any(line.startswith(f"scores: {judged} E(H+) ") for line in lines), shown
    if report.sections.get("budget_table"):
        assert f"budget: {judged}" in lines, shown


def test_counts_in_check_details_take_the_number_they_need() -> None:
    from holedger.replay.report import counted

    assert counted(1, "request") == "1 request"
    assert counted(0, "request") == "0 requests"
    assert counted(2, "projection") == "2 projections"
    assert counted(3, "case", "cases") == "3 cases"
    assert counted(1, "match", "matches") == "1 match"
    assert counted(2, "match", "matches") == "2 matches"
