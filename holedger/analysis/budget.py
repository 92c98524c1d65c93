"""Budget use (A14) and target tokens beside gain (A15), per run and across runs.

Per run (a "cell" of A14 is one scored run: reading, not stated):

* call usage = (dev + val calls used) / (dev + val call limits) (the paper's /200);
* case-pass usage = passes used / (dev + val allowances) (reading, not stated: the
  allowance is both splits together, 8 by default; the alternative, the larger
  per-split share, is reported beside it as ``max_split_pass_usage``);
* exhausted = dev or val used all of its case passes;
* binds first = the first budget component to reach its limit, in the order of the
  signed requests (dev/val calls, dev/val case passes, target tokens), or none.

Across runs: the median of each usage, exhausted counts overall, by harness scope and
by task, and how often each component bound first. A15: search-phase target tokens per
run beside g (reading, not stated: tokens of dev and val trials only), and per task
Spearman's rho between them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from holedger.analysis.facts import RunFacts
from holedger.analysis.grid import Observation
from holedger.analysis.stats import median, number, spearman

READINGS = [
    "A14: a cell is one scored run; the analysable cells are the runs in the grid "
    "(reading, not stated)",
    "A2: a case pass is |split| case evaluations; a request costs |Q| x attempts / |split| "
    "(reading, not stated)",
    "A14: case-pass usage is over both splits' allowances together (reading, not stated); "
    "max_split_pass_usage gives the alternative",
    "A15: target tokens are the search phase's (dev and val trials) (reading, not stated)",
]


def run_usage(f: RunFacts) -> dict[str, Any]:
    call_limit = sum(f.call_limits.values())
    pass_limit = sum(f.pass_limits.values(), Fraction(0))
    calls = Fraction(sum(f.calls.values()), call_limit) if call_limit else None
    passes = sum(f.passes.values(), Fraction(0)) / pass_limit if pass_limit else None
    shares = [f.passes[s] / f.pass_limits[s] for s in f.pass_limits if f.pass_limits[s]]
    exhausted = [s for s in f.pass_limits if f.pass_limits[s] and f.passes[s] >= f.pass_limits[s]]
    return {
        "call_usage": calls,
        "pass_usage": passes,
        "max_split_pass_usage": max(shares) if shares else None,
        "exhausted_splits": exhausted,
        "binds_first": f.first_bound or "none",
    }


def budget_use(observations: Sequence[Observation], facts: dict[str, RunFacts]) -> dict[str, Any]:
    runs = []
    by_scope: Counter[str] = Counter()
    by_task: Counter[str] = Counter()
    scope_n: Counter[str] = Counter()
    task_n: Counter[str] = Counter()
    first: Counter[str] = Counter()
    call_u: list[Fraction] = []
    pass_u: list[Fraction] = []
    for obs in observations:
        f = facts.get(obs.run_id or "")
        if f is None:
            continue
        u = run_usage(f)
        scope_n[obs.scope] += 1
        task_n[obs.task] += 1
        if u["exhausted_splits"]:
            by_scope[obs.scope] += 1
            by_task[obs.task] += 1
        first[u["binds_first"]] += 1
        if u["call_usage"] is not None:
            call_u.append(u["call_usage"])
        if u["pass_usage"] is not None:
            pass_u.append(u["pass_usage"])
        runs.append(
            {
                **obs.who(),
                "harness_scope": obs.scope,
                "g": number(obs.g),
                "call_usage": number(u["call_usage"]),
                "pass_usage": number(u["pass_usage"]),
                "max_split_pass_usage": number(u["max_split_pass_usage"]),
                "exhausted_splits": u["exhausted_splits"],
                "binds_first": u["binds_first"],
                "calls": f.calls,
                "case_passes": {k: number(v) for k, v in f.passes.items()},
                "target_tokens_search": f.target_tokens_search,
                "target_tokens_heldout": f.target_tokens_heldout,
                "optimizer_tokens": f.optimizer_tokens,
            }
        )
    return {
        "runs": runs,
        "median_call_usage": number(median(call_u) if call_u else None),
        "median_pass_usage": number(median(pass_u) if pass_u else None),
        "exhausted": sum(1 for r in runs if r["exhausted_splits"]),
        "exhausted_by_scope": {s: f"{by_scope[s]}/{scope_n[s]}" for s in sorted(scope_n)},
        "exhausted_by_task": {t: f"{by_task[t]}/{task_n[t]}" for t in sorted(task_n)},
        "binds_first": dict(sorted(first.items())),
        "readings": READINGS,
    }


def tokens_vs_gain(
    observations: Sequence[Observation], facts: dict[str, RunFacts]
) -> dict[str, Any]:
    per_task: dict[str, list[tuple[Fraction, Fraction]]] = defaultdict(list)
    runs = []
    for obs in observations:
        f = facts.get(obs.run_id or "")
        if f is None:
            continue
        runs.append(
            {
                **obs.who(),
                "g": number(obs.g),
                "target_tokens_search": f.target_tokens_search,
                "target_tokens_heldout": f.target_tokens_heldout,
                "optimizer_tokens": f.optimizer_tokens,
            }
        )
        if obs.g is not None:
            per_task[obs.task].append((Fraction(f.target_tokens_search), obs.g))
    rho = {
        t: spearman([x for x, _ in pts], [y for _, y in pts]) for t, pts in sorted(per_task.items())
    }
    return {"runs": runs, "spearman_target_tokens_g": rho, "readings": READINGS[3:]}
