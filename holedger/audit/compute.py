"""The numbers of an HDA audit from the facts of the logs: one function per step, used by
the audit when it records a step and by verification when it recomputes it.

Search set (a reading, not stated): the dev and val cases the nominee Ĥ was evaluated on
in the audited run; if it was evaluated on none, every dev and val case any candidate of
the run was evaluated on. Scores per case are means over attempts; H0's trials are the
seed's trials of the run plus the audit's control evaluations of H0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from holedger.audit import stats
from holedger.audit.facts import RunFacts, Trial, mean_per_case, per_case

READINGS = {
    **stats.READINGS,
    "B1.search_set": "the dev and val cases the nominee was evaluated on in the run (else "
    "those any candidate was); H0 is the run's seed commit, evaluated by control "
    "evaluations on the cases the run has no seed trial of",
    "B3.neutral": "when no detector or person finds a mechanism, Hneutral = H^ and O = 0",
}


def search_set(run: RunFacts, nominee: str) -> dict[str, list[str]]:
    """Search cases per split (sorted)."""
    chosen = run.search_trials(nominee) or [t for t in run.trials if t.split in ("dev", "val")]
    out: dict[str, set[str]] = {"dev": set(), "val": set()}
    for t in chosen:
        out[t.split].add(t.case_id)
    return {split: sorted(ids) for split, ids in out.items() if ids}


def attempts_of(trials: Sequence[Trial]) -> int:
    """The audit's attempts per case: the most attempts Ĥ had on a search case (at least 1)."""
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.case_id] = counts.get(t.case_id, 0) + 1
    return max(counts.values(), default=1)


def on_cases(trials: Sequence[Trial], cases: dict[str, list[str]]) -> list[Trial]:
    wanted = {(split, c) for split, ids in cases.items() for c in ids}
    return [t for t in trials if (t.split, t.case_id) in wanted]


def missing(trials: Sequence[Trial], cases: dict[str, list[str]]) -> dict[str, list[str]]:
    have = {(t.split, t.case_id) for t in trials}
    out = {split: [c for c in ids if (split, c) not in have] for split, ids in cases.items()}
    return {split: ids for split, ids in out.items() if ids}


def gate(
    hhat: Sequence[Trial], h0: Sequence[Trial], *, resamples: int, seed: int, alpha: Fraction
) -> stats.GateResult:
    return stats.paired_bootstrap(
        stats.case_means(per_case(hhat)),
        stats.case_means(per_case(h0)),
        resamples=resamples,
        seed=seed,
        alpha=alpha,
    )


def scale(hhat: Sequence[Trial], h0: Sequence[Trial]) -> stats.ScaleFactor:
    return stats.scale_factor(
        mean_per_case(hhat, "gateway_calls"),
        mean_per_case(h0, "gateway_calls"),
        mean_per_case(hhat, "tokens"),
        mean_per_case(h0, "tokens"),
    )


def s_of(trials: Sequence[Trial], cases: Sequence[str]) -> Fraction:
    """S over ``cases``: the mean of per-case means (cases without trials are refused)."""
    means = stats.case_means(per_case(trials))
    absent = [c for c in cases if c not in means]
    if absent:
        raise ValueError(f"no trial on case {absent[0]}")
    return sum((means[c] for c in cases), Fraction(0)) / len(cases)


def s_scaled(
    trials: Sequence[Trial],
    answers: dict[str, Any],
    cases: Sequence[str],
    k: int,
    aggregator: stats.Aggregator,
) -> Fraction:
    """S(H0scale): each case's attempts cut into groups of k and aggregated."""
    by_case: dict[str, list[Trial]] = {}
    for t in trials:
        by_case.setdefault(t.case_id, []).append(t)
    total = Fraction(0)
    for case in cases:
        ordered = sorted(by_case.get(case, []), key=lambda t: t.attempt)
        total += stats.aggregate_case(
            [(answers.get(t.trial_id), t.score) for t in ordered], k, aggregator
        )
    return total / len(cases)


@dataclass(frozen=True)
class Terms:
    """The four harnesses' search-set trials an audit decomposes."""

    hhat: list[Trial]
    h0: list[Trial]
    h0scale: list[Trial]
    hneutral: list[Trial]


def strata(
    hhat: Sequence[Trial], h0: Sequence[Trial], tags: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """B6 on the search set: per tag, S(H^), S(H0) and dS over the paired cases; [] when
    the task tags none of them."""
    cand = stats.case_means(per_case(hhat))
    base = stats.case_means(per_case(h0))
    if not any(tags.get(c) for c in set(cand) & set(base)):
        return []
    return stats.stratify(cand, base, tags)


def held_out_strata(
    run: RunFacts,
    baseline: RunFacts | None,
    tags: dict[str, list[str]],
    search_tags: set[str],
) -> dict[str, list[dict[str, Any]]]:
    """B6 on the held-out split: per tag, S_test of Ĥ (the run's RunScored) and of H0 (the
    seed-baseline run's), and the types left out of the search set; empty lists when the
    run or its baseline has no per-case test scores, or no test case is tagged."""
    if baseline is None or not run.held_out_cases or not baseline.held_out_cases:
        return {"held_out_strata": [], "left_out_types": []}
    cand = stats.case_means(run.held_out_cases)
    base = stats.case_means(baseline.held_out_cases)
    if not any(tags.get(c) for c in set(cand) & set(base)):
        return {"held_out_strata": [], "left_out_types": []}
    return {
        "held_out_strata": stats.stratify(cand, base, tags),
        "left_out_types": stats.left_out_types(cand, base, tags, search_tags),
    }


def val_means(run: RunFacts) -> dict[str, Fraction]:
    """Each candidate's val score: the mean over its val cases of its per-case means."""
    by_candidate: dict[str, list[Trial]] = {}
    for t in run.trials:
        if t.split == "val":
            by_candidate.setdefault(t.candidate, []).append(t)
    out = {}
    for candidate, trials in by_candidate.items():
        means = stats.case_means(per_case(trials))
        out[candidate] = sum(means.values(), Fraction(0)) / len(means)
    return out


def val_selected(run: RunFacts, nominee: str) -> str | None:
    """B5's val-selected candidate of the run (in commit order for ties)."""
    return stats.select_by_val(val_means(run), list(run.parents), nominee)


def val_selection(
    run: RunFacts, nominee: str, search_delta: Fraction, hval: Sequence[Trial]
) -> dict[str, Any] | None:
    """B5 validation selection, from the run's RunScored (H^) and the Hval control trials
    (the val-selected candidate on the test split); None when the run is not scored or
    no candidate was evaluated on val."""
    chosen = val_selected(run, nominee)
    if run.held_out is None or chosen is None:
        return None
    e_plus, e_zero = run.held_out
    if chosen == nominee:
        e_val = e_plus
    else:
        trials = [t for t in hval if t.candidate == chosen and t.split == "test"]
        if not trials:
            raise ValueError(f"no held-out control trials of the val-selected {chosen[:12]}")
        means = stats.case_means(per_case(trials))
        e_val = sum(means.values(), Fraction(0)) / len(means)
    return stats.val_selection(nominee, chosen, e_plus - e_zero, e_val - e_zero, search_delta)


def transfer_of(
    run: RunFacts, nominee: str, search_delta: Fraction, hval: Sequence[Trial]
) -> dict[str, Any] | None:
    """B5 for one setting: the held-out gain against the search gain, and validation
    selection; None when the run is not scored."""
    if run.held_out is None:
        return None
    out = stats.transfer(search_delta, run.held_out[0] - run.held_out[1])
    out["val_selection"] = val_selection(run, nominee, search_delta, hval)
    return out
