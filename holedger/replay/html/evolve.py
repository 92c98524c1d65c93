"""The solve-evolve section of a run's page (only a solve-evolve run has one): the terms
its stream was fed under, each closed step (the batch's mean under the harness before the
step, what the evolver did, its tokens) and the in-situ score J beside Base."""

from __future__ import annotations

from fractions import Fraction

from holedger.numbers import Mean
from holedger.replay.html.markup import esc, fmt_score, html_table, section
from holedger.replay.html.plots import Bar, bar_rows
from holedger.replay.html.timeline import Evaluation, Timeline
from holedger.replay.report import counted

SECTION_ID = "solve-evolve"
TITLE = "Solve-evolve: steps over the stream and the in-situ score"


def evolve_section(t: Timeline) -> str:
    """The section, or "" for a run that is no solve-evolve run."""
    terms = t.header.solve_evolve
    if terms is None:
        return ""
    cap = "no cap" if terms.step_tokens is None else f"at most {terms.step_tokens}"
    head = (
        f"<p>A stream of {esc(counted(len(terms.stream), 'dev case'))} fed in "
        f"{esc(counted(terms.steps, 'step'))} of {esc(terms.batch)} cases; each batch is "
        "scored under the harness before its step, and the evolver then may change "
        f"{esc(', '.join(terms.scope) or 'nothing')} (evolver tokens per step: {esc(cap)}). "
        f"{esc(len(t.steps))} of {esc(terms.steps)} steps closed.</p>"
    )
    by_request = {e.request_id: e for e in t.evaluations}
    rows, bars = [], []
    for step in t.steps:
        ev = by_request.get(step.request_id)
        mean = ev.mean if ev else None
        changed = (
            f"{t.candidate_index(step.parent)} → {t.candidate_index(step.candidate)}"
            if step.outcome == "committed"
            else f"{t.candidate_index(step.candidate)} kept"
        )
        rows.append(
            [
                step.step,
                step.outcome,
                changed,
                step.request_id,
                _batch_text(ev),
                step.evolver_tokens,
            ]
        )
        if mean is not None:
            label = f"step {step.step} ({step.outcome})"
            bars.append(Bar(label, float(mean), fmt_score(mean), "dev"))
    table = (
        html_table(["step", "outcome", "harness", "request", "batch score", "evolver tokens"], rows)
        if rows
        else "<p class='muted'>no step closed</p>"
    )
    plot = (
        "<h3>Batch score per step, under the harness before the step</h3>" + bar_rows(bars)
        if bars
        else ""
    )
    return section(SECTION_ID, TITLE, head + plot + "<h3>Steps</h3>" + table + _in_situ(t))


def _batch_text(ev: Evaluation | None) -> str:
    if ev is None or ev.mean is None:
        return "-"
    total = sum(ev.scores, Fraction(0))
    return Mean(total, len(ev.scores), len(ev.by_case)).text()


def _in_situ(t: Timeline) -> str:
    s = t.in_situ
    if s is None:
        return "<p class='muted'>no in-situ score: the run has no InSituScored</p>"
    trials = sum(len(v) for v in s.per_case.values())
    total = sum((x for v in s.per_case.values() for x in v), Fraction(0))
    cases = len(s.per_case)
    j = Mean(total, trials, cases).text() if trials and total / trials == s.j else fmt_score(s.j)
    base = "none pinned" if s.base is None else fmt_score(s.base)
    delta = "-" if s.delta is None else ("+" if s.delta > 0 else "") + fmt_score(s.delta)
    return (
        f"<h3>In-situ score</h3><p class='big'>J = {esc(j)}; Base = {esc(base)}; "
        f"J − Base = {esc(delta)}</p><p class='muted'>J: the pass rate over the stream, "
        "each case scored once, under the harness of its step; Base: the J of the pinned "
        "NONE run (the same stream under the seed throughout).</p>"
    )
