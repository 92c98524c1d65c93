"""The report's sections on the search: candidates with their diffs and the prepared edit
each is, dev and val results (one chart per split), per-case dev results per candidate,
the evaluation requests, and the tokens of the trials by split."""

from __future__ import annotations

from fractions import Fraction

from holedger.numbers import Mean
from holedger.replay.html.diffs import CandidateDiff
from holedger.replay.html.markup import Markup, esc, fmt_score, html_table, section
from holedger.replay.html.plots import split_mean_plot, tokens_plot
from holedger.replay.html.timeline import Candidate, Timeline, Trial
from holedger.replay.report import counted

SPLITS = ("dev", "val", "test")


def _changed(cand: Candidate, diff: CandidateDiff | None) -> str:
    if cand.index == 0:
        return "the seed harness"
    if diff is not None:
        return f"+{diff.added} −{diff.removed} lines in {counted(diff.files, 'file')}"
    if len(cand.changed) > 8:
        return f"{len(cand.changed)} files"
    return ", ".join(cand.changed) or "-"


def _edit(diff: CandidateDiff | None) -> str:
    if diff is None or diff.edit is None:
        return "-"
    lever = f" ({diff.edit.lever})" if diff.edit.lever else ""
    return diff.edit.name + lever


def candidates_section(data: Timeline) -> str:
    per_cand: dict[str, dict[str, list[Fraction]]] = {}
    for ev in data.evaluations:
        if ev.mean is not None:
            per_cand.setdefault(ev.candidate, {}).setdefault(ev.split, []).append(ev.mean)
    rows = []
    for cand in data.candidates:
        results = per_cand.get(cand.commit, {})
        diff = cand.diff
        rows.append(
            [
                f"#{cand.index}",
                cand.commit[:12],
                data.candidate_index(cand.parent) if cand.parent else "-",
                _edit(diff),
                _changed(cand, diff),
                " ".join(fmt_score(m) for m in results.get("dev", [])) or "-",
                " ".join(fmt_score(m) for m in results.get("val", [])) or "-",
                "yes" if cand.commit == data.nominated else "",
            ]
        )
    cand_table = html_table(
        [
            "candidate",
            "commit",
            "parent",
            "prepared edit",
            "changes",
            "dev means",
            "val means",
            "nominated",
        ],
        rows,
    )
    body = (
        "<h3>Dev: mean per evaluation (per-case results disclosed)</h3>"
        + split_mean_plot(data, "dev")
        + "<h3>Val: mean per evaluation (only the aggregate disclosed)</h3>"
        + split_mean_plot(data, "val")
        + "<h3>Candidates</h3>"
        + cand_table
        + "<h3>Per-case dev results per candidate</h3>"
        + dev_cases_table(data)
        + "<h3>What each candidate changed</h3>"
        + diffs_html(data)
        + "<h3>Evaluation requests</h3>"
        + requests_table(data)
    )
    return section("candidates", "Candidates: dev and val results over time", body)


def dev_cases_table(data: Timeline) -> str:
    """Rows: the dev cases evaluated; columns: the candidates evaluated on dev; each cell
    the candidate's mean score on that case over all its dev trials of it."""
    scores: dict[str, dict[str, list[Fraction]]] = {}
    for trial in data.trials:
        if trial.split == "dev":
            scores.setdefault(trial.candidate, {}).setdefault(trial.case_id, []).append(trial.score)
    cands = [c for c in data.candidates if c.commit in scores]
    if not cands:
        return "<p class='muted'>no dev trials</p>"
    cases = sorted({case for by_case in scores.values() for case in by_case})
    rows = []
    for case in cases:
        row: list[object] = [case]
        for cand in cands:
            got = scores[cand.commit].get(case)
            if not got:
                row.append("")
                continue
            mean = Mean(sum(got, Fraction(0)), len(got), 1)
            row.append(Markup(f'<span title="{esc(mean.text())}">{fmt_score(mean.value)}</span>'))
        rows.append(row)
    note = (
        "<p class='muted'>each cell: the candidate's mean score on the case over its dev "
        "trials (the counts are in the cell's tooltip); empty: not evaluated on it</p>"
    )
    return note + html_table(["dev case", *(f"#{c.index}" for c in cands)], rows, cls="cases")


def diffs_html(data: Timeline) -> str:
    if not any(c.diff for c in data.candidates):
        return (
            "<p class='muted'>the run's candidate repository was not available: the changed "
            "paths the events record are in the candidates table</p>"
        )
    parts = []
    for cand in data.candidates:
        diff = cand.diff
        if diff is None:
            continue
        edit = f" = prepared edit {esc(_edit(diff))}" if diff.edit else ""
        parent = data.candidate_index(cand.parent) if cand.parent else "-"
        summary = (
            f"#{cand.index} (from {esc(parent)}){edit}: +{diff.added} −{diff.removed} lines "
            f"in {counted(diff.files, 'file')}"
        )
        lines = "".join(
            f'<span class="d{ {"+": "a", "-": "r", "@": "h", "=": "f"}.get(kind, "c") }">'
            f"{esc(_prefix(kind) + text)}</span>\n"
            for kind, text in diff.lines
        )
        more = f"<p class='muted'>… {diff.hidden} more lines</p>" if diff.hidden else ""
        desc = (
            f"<p class='muted'>{esc(diff.edit.description)}</p>"
            if diff.edit and diff.edit.description
            else ""
        )
        parts.append(
            f"<details><summary>{summary}</summary>{desc}<pre class='diff'>{lines}</pre>"
            f"{more}</details>"
        )
    return "".join(parts) or "<p class='muted'>no candidate beyond the seed</p>"


def _prefix(kind: str) -> str:
    return {"+": "+", "-": "-", " ": " ", "@": "", "=": "file "}.get(kind, "")


def requests_table(data: Timeline) -> str:
    rows = [
        [
            ev.seq,
            ev.request_id,
            data.candidate_index(ev.candidate),
            ev.split,
            f"{ev.cases} × {ev.attempts}",
            ev.decision + (f" ({ev.reason})" if ev.reason else ""),
            fmt_score(ev.mean),
            ev.tokens,
        ]
        for ev in data.evaluations
    ]
    return html_table(
        ["seq", "request", "candidate", "split", "cases × attempts", "decision", "mean", "tokens"],
        rows,
    )


def tokens_section(data: Timeline) -> str:
    by_split: dict[str, list[Trial]] = {}
    for trial in data.trials:
        by_split.setdefault(trial.split, []).append(trial)
    parts = []
    rows = []
    for split in sorted(by_split, key=lambda s: SPLITS.index(s) if s in SPLITS else 9):
        trials = by_split[split]
        tokens = [t.tokens for t in trials]
        title = "test (held-out scoring)" if split == "test" else split
        parts.append(f"<h3>{esc(title)}</h3>" + tokens_plot(trials, split))
        rows.append(
            [split, len(tokens), sum(tokens), round(sum(tokens) / len(tokens)), max(tokens)]
        )
    table = html_table(["split", "trials", "tokens", "mean per trial", "max"], rows)
    if not parts:
        parts.append("<p class='muted'>no trials</p>")
    return section("tokens", "Tokens per trial, by split", "".join(parts) + table)
