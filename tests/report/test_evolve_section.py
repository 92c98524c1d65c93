"""The report's solve-evolve section: its steps and in-situ score taken into the timeline
from a real solve-evolve run (values worked out by hand), and rendered from a timeline built
by hand with no ledger."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction as F
from pathlib import Path

from evolve.writer import H1, SEED, EvolveWriter

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.protocol import evolve
from holedger.replay.html import render_html, replay_timeline
from holedger.replay.html.evolve import evolve_section
from holedger.replay.html.timeline import InSitu, Step
from holedger.schemas.events import EvolveTerms

from .html_checks import page_problems
from .test_timeline_page import hand_timeline


def test_steps_and_in_situ_score_of_a_real_solve_evolve_run(tmp_path: Path) -> None:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        w = EvolveWriter(ledger)  # 3 steps of 2 cases: dev-0 .. dev-5
        w.solve(1, SEED, {"dev-0": 1, "dev-1": 0})
        w.commit(H1, SEED, ["harness/prompts/p.txt"])
        w.close_step(1, "committed", SEED, H1)
        w.solve(2, H1, {"dev-2": 1, "dev-3": 1})
        w.close_step(2, "unchanged", H1, H1)
        w.solve(3, H1, {"dev-4": 0, "dev-5": 1})
        w.close_step(3, "unchanged", H1, H1)
        w.finish()
        report, t = replay_timeline(ledger, w.run_id)
    finally:
        ledger.close()
    assert report.verified, report.failed_checks()
    assert t.header.solve_evolve is not None and t.header.solve_evolve.batch == 2
    assert [(s.step, s.outcome, s.parent, s.candidate) for s in t.steps] == [
        (1, "committed", SEED, H1),
        (2, "unchanged", H1, H1),
        (3, "unchanged", H1, H1),
    ]
    means = {e.request_id: e.mean for e in t.evaluations}
    assert [means[s.request_id] for s in t.steps] == [F(1, 2), F(1), F(1, 2)]
    # J: 4 of the 6 stream cases passed, each scored once; no NONE run pinned: no Base
    assert t.in_situ is not None
    assert (t.in_situ.j, t.in_situ.base, t.in_situ.delta) == (F(2, 3), None, None)
    assert t.in_situ.per_case["dev-1"] == (F(0),)
    page = render_html(t)
    assert page_problems(page) == []
    at = page.index('<section id="solve-evolve">')
    body = page[at : page.index("</section>", at)]
    assert "<td>1</td><td>committed</td><td>#0 → #1</td><td>step-0001</td>" in body
    assert "<td>2</td><td>unchanged</td><td>#1 kept</td>" in body
    assert "0.500: 1 of 2 trials over 2 cases" in body
    assert "J = 0.667: 4 of 6 trials over 6 cases; Base = none pinned; J − Base = -" in body
    assert '<a href="#solve-evolve">' in page


def test_the_section_renders_a_timeline_built_by_hand() -> None:
    hand = hand_timeline()
    assert evolve_section(hand) == ""  # no solve-evolve run: no section
    seed, edited = (c.commit for c in hand.candidates)
    stream = ["hand-dev-0", "hand-dev-1"]
    terms = EvolveTerms(
        stream=stream,
        stream_digest=evolve.stream_digest("dev", stream),
        batch=2,
        steps=4,
        scope=["harness/hand/"],
        step_tokens=321,
    )
    t = replace(
        hand,
        header=replace(hand.header, solve_evolve=terms),
        steps=(Step(20, 1, "committed", seed, edited, "req-hand-1", 4321),),
        in_situ=InSitu(
            30, {"hand-dev-0": (F(1),), "hand-dev-1": (F(0),)}, F(1, 2), F(1, 4), F(1, 4)
        ),
    )
    body = evolve_section(t)
    assert "A stream of 2 dev cases fed in 4 steps of 2 cases" in body
    assert "harness/hand/" in body and "at most 321" in body and "1 of 4 steps closed" in body
    # the step's batch is the hand-made dev request: 1 and 1/2, mean 3/4
    assert "<td>#0 → #1</td><td>req-hand-1</td><td>0.750: 1.5 of 2 trials over 2 cases</td>" in body
    assert "<td>4321</td>" in body
    j_text = "J = 0.500: 1 of 2 trials over 2 cases; Base = 0.250; J − Base = +0.250"
    assert j_text in body
    page = render_html(t)
    assert page_problems(page) == [] and body in page
