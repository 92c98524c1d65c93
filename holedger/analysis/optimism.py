"""Val-best against held-out optimism (A16) and the token frontier (A17).

A16, per run: v* = the largest val aggregate disclosed to the optimizer during search
(any candidate, any request), y = E(H+) on test; both raw scores (reading, not stated).
Optimism = v* - y; a run lies below the identity line when y < v*. A run shown no val
aggregate is left out, named.

A17, per task, one point per run: x = optimizer tokens (total, as the gateway metered
them), y = g. A point is on the frontier when no other point dominates it, weakly:
no more cost and no less gain, one of them strictly (reading, not stated). A run whose
optimizer made no metered calls has no cost to plot and is left out, named.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from holedger.analysis.facts import RunFacts
from holedger.analysis.grid import Observation
from holedger.analysis.stats import mean, number

READING_OPTIMISM = "A16: v* and y are raw scores, not gains (reading, not stated)"
READING_FRONTIER = (
    "A17: weak dominance, no more cost and no less gain, one strictly (reading, not stated)"
)


def optimism(observations: Sequence[Observation], facts: dict[str, RunFacts]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    gaps: list[Fraction] = []
    left_out = []
    for obs in observations:
        f = facts.get(obs.run_id or "")
        if f is None:
            continue
        if f.val_best is None:
            left_out.append({"run": obs.run_id, "why": "no val aggregate was disclosed"})
            continue
        gaps.append(f.val_best - f.e_h_plus)
        rows.append(
            {
                **obs.who(),
                "val_best": number(f.val_best),
                "heldout": number(f.e_h_plus),
                "optimism": number(f.val_best - f.e_h_plus),
                "below_identity": f.e_h_plus < f.val_best,
                "val_aggregates_seen": f.val_aggregates,
            }
        )
    return {
        "runs": rows,
        "below_identity": sum(r["below_identity"] for r in rows),
        "of": len(rows),
        "mean_optimism": number(mean(gaps) if gaps else None),
        "left_out": left_out,
        "readings": [READING_OPTIMISM],
    }


def frontier(observations: Sequence[Observation], facts: dict[str, RunFacts]) -> dict[str, Any]:
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    left_out = []
    for obs in observations:
        f = facts.get(obs.run_id or "")
        if f is None or obs.g is None:
            continue
        cost = f.optimizer_tokens.get("total", 0)
        if cost <= 0:
            left_out.append({"run": obs.run_id, "why": "no optimizer tokens were metered"})
            continue
        by_task[obs.task].append(
            {
                "run_id": obs.run_id,
                "model": obs.model,
                "harness": obs.harness,
                "tokens": cost,
                "g": obs.g,
            }
        )
    tasks = {}
    for task, pts in sorted(by_task.items()):
        for p in pts:
            p["on_frontier"] = not any(_dominates(q, p) for q in pts if q is not p)
            if not p["on_frontier"]:
                same_gain = any(q["g"] >= p["g"] and q["tokens"] < p["tokens"] for q in pts)
                p["label"] = "same gain, costlier" if same_gain else "same cost, lower gain"
        tasks[task] = [
            {**p, "g": number(p["g"])}
            for p in sorted(pts, key=lambda p: (p["tokens"], -p["g"], p["run_id"]))
        ]
    return {"tasks": tasks, "left_out": left_out, "readings": [READING_FRONTIER]}


def _dominates(q: dict[str, Any], p: dict[str, Any]) -> bool:
    return bool(
        q["tokens"] <= p["tokens"]
        and q["g"] >= p["g"]
        and (q["tokens"] < p["tokens"] or q["g"] > p["g"])
    )
