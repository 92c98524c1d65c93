"""LSS-lambda (A7): the task-adjusted optimizer-model effect of the additive model

    g_mt = mu + tau_t + lambda_m + eps_mt,   sum_t tau_t = 0,   sum_m lambda_m = 0,

fitted to the cell means g_mt of one shared harness. A balanced grid has the closed form
lambda_m = (1/|T|) sum_t g_mt - grand mean. A grid with missing cells is refused, or
fitted by least squares under the same sum-to-zero constraints (reading, not stated);
the result says which. Exact rationals throughout (the normal equations are solved by
fraction-exact Gaussian elimination).

Tiers (reading, not stated): sort lambda descending, start a new tier where the adjacent
gap exceeds the estimator resolution. The resolution (reading, not stated) is the median
over models of |lambda(replicate 1) - lambda(replicate 2)| when both replicates exist,
else the paper's 0.058, else a value given by the user; the output names its source.

Auxiliary estimators (reading, not stated): the within-task standardized gain, mean over
t of (g_mt - mean_m g_mt) / sd_m g_mt (sample sd); the mean within-task rank, models ranked
within each task (1 = highest g, ties averaged) and the ranks averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.analysis.bands import READING_TIERS, tiers
from holedger.analysis.stats import average_ranks, mean, median, number, sample_sd

PAPER_RESOLUTION = Fraction(58, 1000)
READING_UNBALANCED = (
    "A7: a grid with missing cells is fitted by least squares under sum-to-zero "
    "constraints, or refused (reading, not stated)"
)
READING_RESOLUTION = (
    "A7: estimator resolution = median over models of |lambda(rep 1) - lambda(rep 2)| "
    "(reading, not stated)"
)
READING_AUXILIARY = (
    "A7: auxiliary estimators are the within-task standardized gain (sample sd) and the "
    "mean within-task rank, 1 = best, ties averaged (reading, not stated)"
)

Means = dict[tuple[str, str], Fraction]  # (model, task) -> mean g


class Refused(Exception):
    """The grid cannot be fitted as asked; the message says why."""


@dataclass
class LssFit:
    models: list[str]
    tasks: list[str]
    fit: str  # "closed form (balanced)" or "least squares (unbalanced)"
    mu: Fraction
    tau: dict[str, Fraction]
    lam: dict[str, Fraction]
    missing: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "models": self.models,
            "tasks": self.tasks,
            "fit": self.fit,
            "mu": number(self.mu),
            "tau": {t: number(v) for t, v in self.tau.items()},
            "lambda": {m: number(v) for m, v in self.lam.items()},
            "missing_cells": [{"model": m, "task": t} for m, t in self.missing],
        }


def fit_lss(means: Means, *, unbalanced: str = "lsq") -> LssFit:
    """Fit the additive model; ``unbalanced`` is "lsq" or "refuse" for a grid with holes."""
    models = sorted({m for m, _ in means})
    tasks = sorted({t for _, t in means})
    if len(models) < 2:
        raise Refused(f"{len(models)} model(s) in the grid: lambda needs at least two")
    missing = [(m, t) for m in models for t in tasks if (m, t) not in means]
    if not missing:
        grand = mean(list(means.values()))
        lam = {m: mean([means[m, t] for t in tasks]) - grand for m in models}
        tau = {t: mean([means[m, t] for m in models]) - grand for t in tasks}
        return LssFit(models, tasks, "closed form (balanced)", grand, tau, lam)
    if unbalanced != "lsq":
        raise Refused(
            "the grid is not balanced (missing "
            + ", ".join(f"{m} on {t}" for m, t in missing)
            + "); --unbalanced lsq fits it by least squares"
        )
    mu, tau, lam = _least_squares(means, models, tasks)
    return LssFit(models, tasks, "least squares (unbalanced)", mu, tau, lam, missing)


def _least_squares(
    means: Means, models: list[str], tasks: list[str]
) -> tuple[Fraction, dict[str, Fraction], dict[str, Fraction]]:
    """Effect coding (the last task and the last model carry minus the others' sum), the
    normal equations X'X b = X'y solved exactly."""
    nt, nm = len(tasks) - 1, len(models) - 1
    width = 1 + nt + nm

    def row(model: str, task: str) -> list[Fraction]:
        x = [Fraction(1)] + [Fraction(0)] * (nt + nm)
        ti, mi = tasks.index(task), models.index(model)
        for j in range(nt):
            x[1 + j] = Fraction(1 if ti == j else -1 if ti == nt else 0)
        for j in range(nm):
            x[1 + nt + j] = Fraction(1 if mi == j else -1 if mi == nm else 0)
        return x

    a = [[Fraction(0)] * width for _ in range(width)]
    b = [Fraction(0)] * width
    for (model, task), y in means.items():
        x = row(model, task)
        for i in range(width):
            b[i] += x[i] * y
            for j in range(width):
                a[i][j] += x[i] * x[j]
    beta = _solve(a, b)
    tau = {t: beta[1 + i] for i, t in enumerate(tasks[:-1])}
    tau[tasks[-1]] = -sum(tau.values(), Fraction(0))
    lam = {m: beta[1 + nt + i] for i, m in enumerate(models[:-1])}
    lam[models[-1]] = -sum(lam.values(), Fraction(0))
    return beta[0], dict(sorted(tau.items())), dict(sorted(lam.items()))


def _solve(a: list[list[Fraction]], b: list[Fraction]) -> list[Fraction]:
    n = len(b)
    m = [[*row[:], b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if m[r][col] != 0), None)
        if pivot is None:
            raise Refused(
                "the cells present do not connect every model and task (the least-squares "
                "fit is not unique)"
            )
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col] != 0:
                factor = m[r][col] / m[col][col]
                m[r] = [x - factor * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def resolution_from_replicates(
    by_replicate: dict[int, Means], unbalanced: str
) -> tuple[Fraction | None, str]:
    """The median |lambda(1) - lambda(2)| over the models both fits have, and a note."""
    if 1 not in by_replicate or 2 not in by_replicate:
        return None, "replicates 1 and 2 are not both present"
    try:
        first = fit_lss(by_replicate[1], unbalanced=unbalanced)
        second = fit_lss(by_replicate[2], unbalanced=unbalanced)
    except Refused as exc:
        return None, f"a replicate's fit was refused: {exc}"
    common = sorted(set(first.lam) & set(second.lam))
    if not common:
        return None, "no model in both replicates"
    return median([abs(first.lam[m] - second.lam[m]) for m in common]), "from replicates 1 and 2"


def standardized_gain(means: Means) -> dict[str, float | None]:
    """Mean over tasks of the model's z-score within the task (tasks with fewer than two
    models, or no spread, are skipped)."""
    tasks = sorted({t for _, t in means})
    scores: dict[str, list[float]] = {}
    for task in tasks:
        row = {m: v for (m, t), v in means.items() if t == task}
        sd = sample_sd(list(row.values()))
        if sd is None or sd == 0:
            continue
        centre = mean(list(row.values()))
        for m, v in row.items():
            scores.setdefault(m, []).append(float(v - centre) / sd)
    models = sorted({m for m, _ in means})
    return {m: (sum(scores[m]) / len(scores[m]) if m in scores else None) for m in models}


def mean_rank(means: Means) -> dict[str, Fraction]:
    """Mean over tasks of the model's rank within the task (1 = highest g)."""
    ranks: dict[str, list[Fraction]] = {}
    for task in sorted({t for _, t in means}):
        row = sorted((m, v) for (m, t), v in means.items() if t == task)
        for (m, _), r in zip(row, average_ranks([v for _, v in row], descending=True), strict=True):
            ranks.setdefault(m, []).append(r)
    return {m: mean(r) for m, r in sorted(ranks.items())}


@dataclass
class LssResult:
    fit: LssFit
    resolution: Fraction
    resolution_source: str
    tier_list: list[list[str]]
    standardized: dict[str, float | None]
    ranks: dict[str, Fraction]
    readings: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.fit.to_json(),
            "resolution": number(self.resolution),
            "resolution_source": self.resolution_source,
            "tiers": self.tier_list,
            "standardized_gain": self.standardized,
            "mean_rank": {m: number(v) for m, v in self.ranks.items()},
            "readings": self.readings,
        }


def lss(
    means: Means,
    *,
    by_replicate: dict[int, Means] | None = None,
    unbalanced: str = "lsq",
    resolution: Fraction | None = None,
) -> LssResult:
    """lambda-hat with tiers and both auxiliary estimators; raises Refused."""
    fit = fit_lss(means, unbalanced=unbalanced)
    readings = [READING_TIERS, READING_AUXILIARY]
    if fit.missing:
        readings.append(READING_UNBALANCED)
    if resolution is not None:
        source = "given (--resolution)"
    else:
        derived, why = resolution_from_replicates(by_replicate or {}, unbalanced)
        if derived is not None:
            resolution, source = derived, why
            readings.append(READING_RESOLUTION)
        else:
            resolution, source = PAPER_RESOLUTION, f"the paper's 0.058 ({why})"
    return LssResult(
        fit,
        resolution,
        source,
        tiers(fit.lam, resolution),
        standardized_gain(means),
        mean_rank(means),
        readings,
    )


def lss_means(cells: Sequence[Any], harness: str, tasks: Sequence[str] | None = None) -> Means:
    """(model, task) -> mean g of the cells of ``harness`` (optionally only ``tasks``)."""
    out: Means = {}
    for c in cells:
        if c.harness == harness and (tasks is None or c.task in tasks) and c.mean is not None:
            out[c.model, c.task] = c.mean
    return out
