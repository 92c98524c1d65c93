"""Every cross-run analysis as one JSON-ready dict, computed from a :class:`Source`:
the command line prints them (text or ``--json``) and the report plots them. Each dict
carries the source header (verified or not, runs left out and why) and the readings of
analyses.md its numbers depend on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from holedger.analysis import budget as budget_mod
from holedger.analysis import ladder as ladder_mod
from holedger.analysis.bands import (
    READING_DERIVED_BAND,
    READING_RESOLVED,
    indistinguishable_from_zero,
)
from holedger.analysis.contrasts import contrasts
from holedger.analysis.grid import (
    READING_NO_CLIP,
    READING_QUALIFYING,
    READING_UNDEFINED_G,
    Cell,
    Observation,
    build_grid,
    task_bands,
)
from holedger.analysis.lss import Refused, lss, lss_means
from holedger.analysis.optimism import frontier, optimism
from holedger.analysis.sources import Source
from holedger.analysis.stats import number

READING_SE = (
    "A3: E(H+)'s error bar is the standard error of its K round means, round r = attempt "
    "r of every test case, sd(n - 1) / sqrt(K) (reading, not stated)"
)
READING_PAIRS = (
    "A5: a re-scoring pairs with the run it re-scores: E1 is the run's own held-out score, "
    "E2 the re-scoring's; N re-scorings of one nominee are N pairs (reading, not stated)"
)
READING_STUB = (
    "A7: a task whose pinned E(H0) is 0 (a stub seed) is left out of the model composite "
    "(reading, not stated)"
)


def _with_header(source: Source, body: dict[str, Any], readings: Sequence[str]) -> dict[str, Any]:
    return {**source.header_json(), **body, "readings": list(readings)}


def cells_of(source: Source) -> list[Cell]:
    bands, _ = task_bands(source.observations)
    cells = build_grid(source.observations)
    for c in cells:
        c.band = bands[c.task]
    return cells


def grid_json(source: Source) -> dict[str, Any]:
    _, notes = task_bands(source.observations)
    cells = cells_of(source)
    runs = []
    for o in source.observations:
        f = source.facts.get(o.run_id or "")
        if f is None:
            continue
        runs.append(
            {
                **o.who(),
                "replicate": o.replicate,
                "e_h_plus": f.e_h_plus,
                "e_h_plus_round_means": list(f.round_means),
                "e_h_plus_se": f.se_h_plus,
                "e_h0": f.e_h0,
                "g": f.g,
            }
        )
    return _with_header(
        source,
        {"cells": [c.to_json() for c in cells], "runs": runs, "band_notes": notes},
        [READING_QUALIFYING, READING_UNDEFINED_G, READING_NO_CLIP, READING_SE],
    )


def reference_harness(cells: Sequence[Cell], given: str | None = None) -> str | None:
    """The shared harness of the primary score: the one given, else the common-scope
    harness with the most cells (ties by name)."""
    if given:
        return given
    counts = Counter(c.harness for c in cells if c.scope == "common" and c.mean is not None)
    if not counts:
        return None
    return min(counts, key=lambda h: (-counts[h], h))


def _stub_tasks(observations: Sequence[Observation]) -> list[str]:
    return sorted({o.task for o in observations if o.e_h0 == 0})


def lss_json(
    source: Source,
    *,
    harness: str | None = None,
    unbalanced: str = "lsq",
    resolution: Fraction | None = None,
    exclude_tasks: Sequence[str] = (),
) -> dict[str, Any]:
    cells = cells_of(source)
    ref = reference_harness(cells, harness)
    stubs = _stub_tasks(source.observations)
    left = sorted(set(stubs) | set(exclude_tasks))
    tasks = sorted({c.task for c in cells} - set(left))
    readings = [READING_STUB]
    body: dict[str, Any] = {"harness": ref, "tasks_left_out": left, "refused": None}
    if ref is None:
        body["refused"] = "no common-scope harness in the grid"
        return _with_header(source, body, readings)
    means = lss_means(cells, ref, tasks)
    reps: dict[int, dict[tuple[str, str], Fraction]] = {}
    for rep in (1, 2):
        rep_obs = [o for o in source.observations if o.replicate == rep]
        if rep_obs:
            reps[rep] = lss_means(build_grid(rep_obs), ref, tasks)
    try:
        result = lss(means, by_replicate=reps, unbalanced=unbalanced, resolution=resolution)
    except Refused as exc:
        body["refused"] = str(exc)
        return _with_header(source, body, readings)
    body.update(result.to_json())
    return _with_header(source, body, [*readings, *body.pop("readings")])


def contrasts_json(source: Source, *, harness: str | None = None) -> dict[str, Any]:
    cells = cells_of(source)
    ref = reference_harness(cells, harness)
    if ref is None:
        return _with_header(source, {"refused": "no common-scope harness in the grid"}, [])
    body = contrasts(cells, ref).to_json()
    return _with_header(source, body, body.pop("readings"))


def ladder_json(source: Source) -> dict[str, Any]:
    out, notes = ladder_mod.ladders(source.observations)
    return _with_header(source, {"ladders": out, "notes": notes}, ladder_mod.READINGS)


def _needs_runs(source: Source, what: str) -> dict[str, Any] | None:
    if source.origin == "table":
        return _with_header(
            source,
            {"refused": f"{what} needs the runs' signed logs; a table holds only g"},
            [],
        )
    return None


def budget_json(source: Source) -> dict[str, Any]:
    refused = _needs_runs(source, "budget use")
    if refused:
        return refused
    body = budget_mod.budget_use(source.observations, source.facts)
    return _with_header(source, body, body.pop("readings"))


def tokens_json(source: Source) -> dict[str, Any]:
    refused = _needs_runs(source, "token use")
    if refused:
        return refused
    body = budget_mod.tokens_vs_gain(source.observations, source.facts)
    return _with_header(source, body, body.pop("readings"))


def optimism_json(source: Source) -> dict[str, Any]:
    refused = _needs_runs(source, "val optimism")
    if refused:
        return refused
    body = optimism(source.observations, source.facts)
    return _with_header(source, body, body.pop("readings"))


def frontier_json(source: Source) -> dict[str, Any]:
    refused = _needs_runs(source, "the token frontier")
    if refused:
        return refused
    body = frontier(source.observations, source.facts)
    return _with_header(source, body, body.pop("readings"))


def paired_rescorings(source: Source) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    """Per task, each re-scoring paired with the run it re-scores, as (that run's id, the
    pair: two full test scorings of one candidate), and the re-scorings left out, each
    with why: its run is not among those read, is itself a re-scoring, or is not of its
    task digest, nominee, tree or pinned E(H0); or another re-scoring claims its index of
    the same run (then each is left out: none may count twice)."""
    from holedger.analysis.bands import Rescoring

    pairs: dict[str, list[Any]] = {}
    left: list[dict[str, Any]] = []
    claims = Counter(
        (r.rescore_of.run_id, r.rescore_of.index) for r in source.rescorings if r.rescore_of
    )
    for r in source.rescorings:
        of = r.rescore_of
        assert of is not None
        base = source.scored.get(of.run_id)
        why = None
        claimed = claims[of.run_id, of.index]
        if claimed > 1:  # counted once, one of them would weigh twice
            why = f"{claimed} runs claim to be re-scoring {of.index} of run {of.run_id}"
        elif base is None:
            why = f"the run it re-scores, {of.run_id}, is not among the runs read"
        elif base.rescore_of is not None:
            why = f"run {of.run_id} is itself a re-scoring, not a run with a search"
        elif base.task_digest != r.task_digest:
            why = f"run {of.run_id} is of another task digest"
        elif base.nominee != of.candidate or base.nominee_tree != of.tree:
            why = f"run {of.run_id}'s nominee is not the candidate and tree it names"
        elif r.nominee_tree != of.tree:
            why = "it scored another tree than the nominee's it names"
        elif base.e_h0 != r.e_h0:
            why = f"run {of.run_id} pins another E(H0)"
        if why is not None:
            left.append({"run": r.run_id, "why": why})
            continue
        assert base is not None
        pairs.setdefault(r.task_id, []).append(
            (of.run_id, Rescoring(base.e_h_plus, r.e_h_plus, r.e_h0, attempts=r.k or 3))
        )
    return pairs, left


def bands_json(source: Source) -> dict[str, Any]:
    """Per task: the band parameter beside b_t derived from the paired re-scorings (A5),
    and the runs whose g the band cannot tell from 0 (|g| <= b)."""
    from holedger.analysis.bands import derived_band

    bands, notes = task_bands(source.observations)
    pairs, left = paired_rescorings(source)
    tasks = []
    for task in sorted(set(bands) | set(pairs)):
        band = bands.get(task)
        gains = [o.g for o in source.observations if o.task == task and o.g is not None]
        mine = pairs.get(task, [])
        derived = derived_band([p for _, p in mine])
        tasks.append(
            {
                "task": task,
                "band_parameter": number(band),
                "band_from_rescorings": derived,
                "rescorings": len(mine),
                "rescored_runs": len({run for run, _ in mine}),
                "observations": len(gains),
                "indistinguishable_from_zero": None
                if band is None
                else sum(indistinguishable_from_zero(g, band) for g in gains),
                "resolved_from_zero": None
                if band is None
                else sum(not indistinguishable_from_zero(g, band) for g in gains),
            }
        )
    count = sum(len(p) for p in pairs.values())
    note = (
        f"b_t from {count} paired re-scorings, beside each task's band parameter"
        if count
        else "no paired re-scorings in these runs ('holedger rescore RUN --times N' makes "
        "them): the band shown is the task's parameter"
    )
    return _with_header(
        source,
        {
            "tasks": tasks,
            "band_notes": notes,
            "rescorings_left_out": left,
            "rescorings_note": note,
        },
        [READING_RESOLVED, READING_DERIVED_BAND, READING_PAIRS],
    )


NO_READS = "no read events recorded"
READING_TRACE = (
    "A13: trace-reading share = reads of evaluation output (a trial's answer or trace "
    "fetched, a projection read again) / every optimizer action (reads, commits, "
    "evaluation requests, the nomination); a deep fetch is a "
    "trace blob fetched, the most detailed read the API offers (reading, not stated)"
)


def trace_json(source: Source) -> dict[str, Any]:
    """A13 from the runs' OptimizerRead events: per run the share of actions that read
    evaluation output and the trace fetches; per task Spearman's rho(share, g); cells with
    at least one deep fetch and the total."""
    from holedger.analysis.stats import spearman

    refused = _needs_runs(source, "trace reading")
    if refused:
        return refused
    runs, unrecorded = [], []
    per_task: dict[str, list[tuple[Fraction, Fraction]]] = {}
    deep_cells: set[tuple[str, str, str]] = set()
    for obs in source.observations:
        facts = source.facts.get(obs.run_id or "")
        if facts is None:
            continue
        reads = facts.reads
        if reads is None:
            unrecorded.append({"run": obs.run_id, "why": NO_READS})
            continue
        share = Fraction(reads.output_reads, reads.actions)
        runs.append(
            {
                **obs.who(),
                "g": number(obs.g),
                "reads": sum(reads.by_kind.values()),
                "reads_by_kind": dict(sorted(reads.by_kind.items())),
                "output_reads": reads.output_reads,
                "trace_fetches": reads.trace_reads,
                "actions": reads.actions,
                "share": number(share),
            }
        )
        if reads.trace_reads:
            deep_cells.add((obs.task, obs.model, obs.harness))
        if obs.g is not None:
            per_task.setdefault(obs.task, []).append((share, obs.g))
    rho = {
        t: spearman([x for x, _ in pts], [y for _, y in pts]) for t, pts in sorted(per_task.items())
    }
    body: dict[str, Any] = {
        "runs": runs,
        "runs_without_reads": unrecorded,
        "spearman_share_g": rho,
        "cells_with_deep_fetch": len(deep_cells),
        "cells": len({(r["task"], r["model"], r["harness"]) for r in runs}),
        "deep_fetches": sum(r["trace_fetches"] for r in runs),
    }
    if not runs:
        body["refused"] = f"{NO_READS} in these runs: trace reading needs them"
    return _with_header(source, body, [READING_TRACE])


def _examined_levers(facts: Any, read: Any, rules: Any) -> set[str] | None:
    """The levers the run's recorded reads examined; None when it records no read."""
    from holedger.analysis.levers import levers_in_file

    if facts.reads is None:
        return None
    ancestry = {c.commit: c for c in facts.candidates}
    seed = facts.candidates[0].commit if facts.candidates else None
    found: set[str] = set()
    for commit, path in facts.reads.examined:
        paths: set[str] = {path} if path is not None else set()
        node = ancestry.get(commit)
        while path is None and node is not None:  # a whole tree: every path it came by
            paths |= set(node.changed_paths)
            parent = node.parent or (seed if node.commit != seed else None)
            node = ancestry.get(parent) if parent else None
        for each in sorted(paths):
            text = read(commit, each)
            if text is not None:
                found |= levers_in_file(each, text, rules)
    return found


def levers_json(source: Source) -> dict[str, Any]:
    """A12: per run the levers its candidates modified, its edits, and per task
    Spearman's rho(breadth, g)."""
    from holedger.analysis.levers import (
        READING,
        READING_EXAMINED,
        classify_candidate,
        load_rules,
    )
    from holedger.analysis.sources import known_task_root
    from holedger.analysis.stats import spearman

    refused = _needs_runs(source, "lever breadth")
    if refused:
        return refused
    readers = source.readers()
    rules_of: dict[str, Any] = {}
    runs = []
    missing = []
    no_reads: list[str | None] = []
    per_task: dict[str, list[tuple[Fraction, Fraction]]] = {}
    for obs in source.observations:
        facts = source.facts.get(obs.run_id or "")
        read = readers.get(obs.run_id or "")
        if facts is None:
            continue
        if read is None:
            missing.append({"run": obs.run_id, "why": "its candidates' trees are not at hand"})
            continue
        if obs.task not in rules_of:
            root = source.task_roots.get(obs.task) or known_task_root(obs.task)
            rules_of[obs.task] = load_rules(root)
        seed = facts.candidates[0].commit if facts.candidates else None
        levers: set[str] = set()
        hunks = unclassified = 0
        for cand in facts.candidates[1:]:
            parent = cand.parent or seed
            if parent is None:
                continue
            got = classify_candidate(
                cand.commit, parent, cand.changed_paths, read, rules_of[obs.task]
            )
            levers |= got.levers
            hunks += got.hunks
            unclassified += got.unclassified
        examined = _examined_levers(facts, read, rules_of[obs.task])
        touched = levers | (examined or set())
        if examined is None:
            no_reads.append(obs.run_id)
        runs.append(
            {
                **obs.who(),
                "g": number(obs.g),
                "levers_modified": sorted(levers),
                "breadth_modified": len(levers),
                "levers_examined": None if examined is None else sorted(examined),
                "breadth_examined": None if examined is None else len(examined),
                "levers_touched": sorted(touched),
                "breadth": number(Fraction(len(touched), 8)),
                "candidates": max(len(facts.candidates) - 1, 0),
                "edits": hunks,
                "unclassified_edits": unclassified,
            }
        )
        if obs.g is not None:
            per_task.setdefault(obs.task, []).append((Fraction(len(touched), 8), obs.g))
    rho = {
        t: spearman([x for x, _ in pts], [y for _, y in pts]) for t, pts in sorted(per_task.items())
    }
    return _with_header(
        source,
        {
            "runs": runs,
            "spearman_breadth_g": rho,
            "trees_missing": missing,
            "examined_note": (
                f"{NO_READS} in {len(no_reads)} of {len(runs)} runs: their breadth counts "
                "levers modified only"
                if no_reads
                else "breadth counts levers examined (read) or modified"
            ),
            "runs_without_reads": no_reads,
        },
        [READING, READING_EXAMINED],
    )
