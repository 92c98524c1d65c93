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
                "run_id": o.run_id,
                "task": o.task,
                "model": o.model,
                "harness": o.harness,
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


def bands_json(source: Source) -> dict[str, Any]:
    """Per task: the band parameter, the runs whose g the band cannot tell from 0, and the
    band derived from paired re-scorings (none are recorded by this version)."""
    bands, notes = task_bands(source.observations)
    tasks = []
    for task in sorted(bands):
        gains = [o.g for o in source.observations if o.task == task and o.g is not None]
        tasks.append(
            {
                "task": task,
                "band_parameter": number(bands[task]),
                "band_from_rescorings": None,
                "rescorings": 0,
                "observations": len(gains),
                "indistinguishable_from_zero": sum(
                    indistinguishable_from_zero(g, bands[task]) for g in gains
                ),
                "resolved_from_zero": sum(
                    not indistinguishable_from_zero(g, bands[task]) for g in gains
                ),
            }
        )
    return _with_header(
        source,
        {
            "tasks": tasks,
            "band_notes": notes,
            "rescorings_note": "no paired re-scorings are recorded in these runs: the band "
            "shown is the task's parameter",
        },
        [READING_RESOLVED, READING_DERIVED_BAND],
    )


def trace_json(source: Source) -> dict[str, Any]:
    """A13 needs the optimizer's action log; these logs do not hold one."""
    refused = _needs_runs(source, "trace reading")
    if refused:
        return refused
    return _with_header(
        source,
        {
            "refused": "the optimizer's reads (projections, trace and output blobs) are not "
            "recorded as signed events in these runs, so the trace-reading share and "
            "deep-fetch counts cannot be computed",
            "runs": sorted(source.facts),
        },
        [
            "A13: trace-reading share = reads of evaluation output / all actions "
            "(reading, not stated)"
        ],
    )


def levers_json(source: Source) -> dict[str, Any]:
    """A12: per run the levers its candidates modified, its edits, and per task
    Spearman's rho(breadth, g)."""
    from holedger.analysis.levers import READING, classify_candidate, load_rules
    from holedger.analysis.sources import known_task_root
    from holedger.analysis.stats import spearman

    refused = _needs_runs(source, "lever breadth")
    if refused:
        return refused
    readers = source.readers()
    rules_of: dict[str, Any] = {}
    runs = []
    missing = []
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
            rules_of[obs.task] = load_rules(known_task_root(obs.task))
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
        runs.append(
            {
                "run_id": obs.run_id,
                "task": obs.task,
                "model": obs.model,
                "harness": obs.harness,
                "g": number(obs.g),
                "levers_modified": sorted(levers),
                "breadth_modified": len(levers),
                "breadth": number(Fraction(len(levers), 8)),
                "examined": None,
                "candidates": max(len(facts.candidates) - 1, 0),
                "edits": hunks,
                "unclassified_edits": unclassified,
            }
        )
        if obs.g is not None:
            per_task.setdefault(obs.task, []).append((Fraction(len(levers), 8), obs.g))
    rho = {
        t: spearman([x for x, _ in pts], [y for _, y in pts]) for t, pts in sorted(per_task.items())
    }
    return _with_header(
        source,
        {
            "runs": runs,
            "spearman_breadth_g": rho,
            "trees_missing": missing,
            "examined_note": "the optimizer's reads are not recorded in these runs: "
            "breadth counts levers modified only",
        },
        [READING],
    )
