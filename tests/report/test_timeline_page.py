"""The page renders from its typed timeline alone: a timeline built by hand, with no ledger
and no replay behind it, gives a page that shows its values, in every section."""

from __future__ import annotations

import re
from fractions import Fraction as F

from sample_terms import task_terms

from holedger.replay.html import Timeline, render_html
from holedger.replay.html.audits import AuditSummary
from holedger.replay.html.diffs import CandidateDiff, PreparedEdit
from holedger.replay.html.timeline import (
    Candidate,
    Disclosure,
    Evaluation,
    Header,
    HeldOut,
    Trial,
    Usage,
    Violation,
)
from holedger.replay.html.verdict import (
    BudgetRow,
    Leakage,
    LeakagePart,
    SafetyCounts,
    ScoresCheck,
    ShownFinding,
    Verification,
)
from holedger.replay.report import CheckResult, Failure
from holedger.schemas.events import SeedBaseline

from .html_checks import page_problems

RUN = "0b0e5a11-0000-4000-8000-00000000a11d"
SEED, EDITED = "5eed" * 10, "ed17" * 10


def _trial(
    seq: int, request: str, cand: str, split: str, case: str, attempt: int, score: F
) -> Trial:
    return Trial(
        seq, f"{request}-{case}-{attempt}", request, cand, split, case, attempt, score, 700 + seq
    )


def hand_timeline() -> Timeline:
    header = Header(
        RUN,
        "hand-task",
        "ab" * 32,
        "hand-optimizer",
        "2026-01-02T03:04:05.000000Z",
        task_terms("hand-task", sizes={"dev": 2, "val": 2, "test": 2}, k=2),
        SeedBaseline(e_h0=F(1, 4), k=2, baseline_run_id=None),
        closed_at="2026-01-02T04:05:06.000000Z",
        close_reason="completed",
    )
    verification = Verification(
        RUN,
        False,
        "failed",
        77,
        checks=(
            CheckResult(name="chain", ok=True, detail="every record chained by hand"),
            CheckResult(name="budget", ok=False, detail="hand-made budget failure"),
        ),
        failures=(
            Failure(seq=9, type="EvaluationRequested", reason="over by hand", check="budget"),
        ),
        failures_total=1,
        trust=("pinned", ("hand-key+0123",)),
        budget=(BudgetRow("dev calls", F(3), F(12)),),
        safety=SafetyCounts(1, (("hand_category", 1),), 6, 0, 0),
        leakage=Leakage(
            LeakagePart("done", None, (ShownFinding(8, "req-hand-2", ("hand-test-1",)),)),
            None,
            True,
            (("min_input_chars", "24"),),
        ),
        scores=ScoresCheck(F(3, 4), F(1, 4), F(2, 3), F(1, 20), "resolved gain"),
        closed=("completed", None),
    )
    dev = (
        _trial(4, "req-hand-1", EDITED, "dev", "hand-dev-0", 0, F(1)),
        _trial(5, "req-hand-1", EDITED, "dev", "hand-dev-1", 0, F(1, 2)),
    )
    test = (
        _trial(11, "req-hand-3", EDITED, "test", "hand-test-0", 0, F(1)),
        _trial(12, "req-hand-3", EDITED, "test", "hand-test-0", 1, F(1, 2)),
        _trial(13, "req-hand-3", EDITED, "test", "hand-test-1", 0, F(1)),
        _trial(14, "req-hand-3", EDITED, "test", "hand-test-1", 1, F(1, 2)),
    )
    edit = PreparedEdit("07-hand-edit", "hand_lever", "An edit written by hand.", (), ())
    diff = CandidateDiff((("=", "harness/hand.py"), ("+", "HAND = 1")), 1, 0, 1, 0, edit)
    return Timeline(
        header,
        verification,
        candidates=(
            Candidate(1, 0, SEED, None, ()),
            Candidate(2, 1, EDITED, SEED, ("harness/hand.py",), diff=diff),
        ),
        evaluations=(
            Evaluation(3, "req-hand-1", EDITED, "dev", 2, 1, "accepted", None, dev),
            Evaluation(7, "req-hand-2", SEED, "val", 2, 1, "rejected", "hand refusal"),
            Evaluation(10, "req-hand-3", EDITED, "test", 2, 2, "accepted", None, test),
        ),
        usage=(Usage("target", 5, 2, 1234), Usage("optimizer", 2, 0, 99)),
        disclosures=(Disclosure(6, "req-hand-1", "dev", "per_case", "d1" * 32),),
        violations=(Violation(8, "hand_category", "a violation written by hand", "t-hand"),),
        nominated=EDITED,
        held_out=HeldOut(
            RUN,
            EDITED,
            2,
            {"hand-test-0": (F(1), F(1, 2)), "hand-test-1": (F(1), F(1, 2))},
            F(3, 4),
            F(1, 4),
            F(2, 3),
        ),
        baseline=HeldOut(
            "base", SEED, 2, {"hand-test-0": (F(0), F(1, 2)), "hand-test-1": (F(0), F(0))}, F(1, 8)
        ),
    )


def test_every_section_shows_the_values_of_a_timeline_built_by_hand() -> None:
    page = render_html(hand_timeline())
    assert page_problems(page) == []
    # verdict: the facts, the checks, the failures, the keys
    assert "VERIFICATION FAILED" in page
    for text in (
        "hand-task",
        "hand-optimizer",
        "2026-01-02T03:04:05.000000Z",
        "<td>7 (2 denied)</td>",  # gateway calls over both scopes
        "every record chained by hand",
        "over by hand",
        "hand-key+0123",
    ):
        assert text in page, text
    # budget: 3 of 12 calls
    assert "3 of 12 (25.0%)" in page
    # candidates: the prepared edit and its lever, the diff, the dev mean (1 + 1/2) / 2
    assert "07-hand-edit (hand_lever)" in page and '<span class="da">+HAND = 1</span>' in page
    assert "<td>#1</td><td>" + EDITED[:12] + "</td><td>#0</td>" in page
    assert "<td>0.750</td>" in page
    assert "rejected (hand refusal)" in page
    at = page.index("Per-case dev results per candidate")
    assert re.search(r"hand-dev-1</td><td><span title=\"[^\"]*\">0.500<", page[at:])
    # tokens: the six trials' tokens are 700 + seq
    assert "704 tokens" in page and "714 tokens" in page
    assert "<td>dev</td><td>2</td><td>1409</td>" in page  # 704 + 705
    # held-out: nominee beside the seed baseline; the nominee's round means are 1 and 1/2,
    # sample variance 1/8, standard error sqrt(1/8 / 2) = 1/4
    assert "nominated candidate: #1" in page
    assert "hand-test-0</td><td>1.000 0.500</td><td>0.750</td><td>0.000 0.500</td>" in page
    assert "0.750 ± 0.250" in page
    assert "0.250 ± 0.125" in page  # E(H0): the baseline's round means 0 and 1/4
    assert "g = 0.667" in page and "resolved gain: |g| &gt; b, resolution band 0.050" in page
    # safety, leakage
    assert "a violation written by hand" in page and "1 safety violation over 6 trials" in page
    assert "hand-test-1" in page[page.index('id="leakage"') :]
    assert "d1" * 32 in page and "min_input_chars 24" in page
    assert "run closed: completed" in page


def test_a_timeline_with_nothing_in_it_still_makes_every_section() -> None:
    empty = Timeline(Header(RUN), Verification(RUN, False, "failed", 0))
    page = render_html(empty)
    assert page_problems(page) == []
    assert "the run was not scored on the held-out split" in page
    assert "no dev evaluation was scored" in page and "no trials" in page


def test_the_audits_section_shows_the_audits_the_timeline_holds() -> None:
    audit = AuditSummary(
        "a-hand",
        "decomposed",
        "1/4 [0, 1/2], p = 1/100",
        "3 (hand)",
        "lookup_table",
        "1/8",
        "1/16",
        "1/16",
        "1/2 / 1/4 / 1/4",
        checks=(("B5 transfer", "a held-out gain written by hand"),),
    )
    assert '<section id="audits">' not in render_html(hand_timeline())
    page = render_html(hand_timeline().with_audits([audit]))
    assert page_problems(page) == [] and '<a href="#audits">' in page
    section = page[page.index('<section id="audits">') :]
    assert "<td>a-hand</td><td>decomposed</td><td>1/4 [0, 1/2], p = 1/100</td>" in section
    assert "<td>1/8</td><td>1/16</td><td>1/16</td><td>1/2 / 1/4 / 1/4</td>" in section
    assert "<td>a-hand</td><td>B5 transfer</td><td>a held-out gain written by hand</td>" in section
