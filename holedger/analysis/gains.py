"""Cross-run statistics from the ledger: normalized gains against resolution bands.

For every scored run: E(H+), the pinned E(H0), g = (E(H+) - E(H0)) / (1 - E(H0)), the
task's resolution band and whether g clears it, and the share of each search-budget
component the optimizer used. Grouped by (task, optimizer): run count, mean, min and max
g, and the fraction of runs whose g clears the band. Everything is read from signed
events (optionally only from runs that replay verifies); nothing is re-executed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.ledger.store import Ledger
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import EvaluationRequested, RunOpened, RunScored
from holedger.server.rules import add_use, no_use

BASELINE_OPTIMIZER = "seed-baseline"


@dataclass(frozen=True)
class RunGain:
    run_id: str
    task_id: str
    optimizer: str
    e_h_plus: Fraction
    e_h0: Fraction
    g: Fraction | None
    band: Fraction
    budget_used: dict[str, Fraction]
    verified: bool | None = None

    @property
    def above_band(self) -> bool:
        return self.g is not None and self.g > self.band

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "task_id": self.task_id,
            "optimizer": self.optimizer,
            "e_h_plus": rational_to_str(self.e_h_plus),
            "e_h0": rational_to_str(self.e_h0),
            "g": None if self.g is None else rational_to_str(self.g),
            "g_float": None if self.g is None else float(self.g),
            "resolution_band": rational_to_str(self.band),
            "above_band": self.above_band,
            "budget_used": {k: float(v) for k, v in self.budget_used.items()},
            "verified": self.verified,
        }


@dataclass
class GroupSummary:
    task_id: str
    optimizer: str
    gains: list[Fraction] = field(default_factory=list)
    above: int = 0
    undefined: int = 0

    def to_json(self) -> dict[str, Any]:
        n = len(self.gains)
        return {
            "task_id": self.task_id,
            "optimizer": self.optimizer,
            "runs": n + self.undefined,
            "mean_g": float(sum(self.gains, Fraction(0)) / n) if n else None,
            "min_g": float(min(self.gains)) if n else None,
            "max_g": float(max(self.gains)) if n else None,
            "above_band": self.above,
            "above_band_fraction": self.above / (n + self.undefined)
            if n + self.undefined
            else None,
        }


def run_gain(ledger: Ledger, run_id: str) -> RunGain | None:
    """The gain of one run, or None when the run was never scored."""
    opened: RunOpened | None = None
    scored: RunScored | None = None
    used = no_use()
    for rec in ledger.records(run_id):
        if rec.type == "RunOpened":
            payload = rec.typed_payload()
            assert isinstance(payload, RunOpened)
            opened = payload
        elif rec.type == "EvaluationRequested":
            req = rec.typed_payload()
            assert isinstance(req, EvaluationRequested)
            if req.decision == "accepted" and req.split in ("dev", "val"):
                used = add_use(used, req.split, req.cost)
        elif rec.type == "RunScored":
            payload = rec.typed_payload()
            assert isinstance(payload, RunScored)
            scored = payload
    if opened is None or scored is None:
        return None
    budget = opened.terms.budget
    shares: dict[str, Fraction] = {}
    for split, limit, use in (("dev", budget.dev, used.dev), ("val", budget.val, used.val)):
        if limit.calls:
            shares[f"{split}_calls"] = Fraction(use.calls, limit.calls)
        if limit.case_passes:
            shares[f"{split}_case_passes"] = use.case_passes / limit.case_passes
    return RunGain(
        run_id=run_id,
        task_id=opened.task_id,
        optimizer=opened.optimizer,
        e_h_plus=scored.e_h_plus,
        e_h0=scored.e_h0,
        g=scored.g,
        band=opened.terms.resolution_band,
        budget_used=shares,
    )


def collect(
    ledger: Ledger,
    *,
    task_id: str | None = None,
    include_baselines: bool = False,
    verify: bool = False,
    excluded: list[str] | None = None,
) -> list[RunGain]:
    """Every scored run's gain, optionally only runs that replay verifies (the ids of the
    scored runs that do not are appended to ``excluded`` when it is given)."""
    gains = []
    for info in ledger.runs():
        if info.state != "closed" or (task_id and info.task_id != task_id):
            continue
        if info.optimizer == BASELINE_OPTIMIZER and not include_baselines:
            continue
        gain = run_gain(ledger, info.run_id)
        if gain is None:
            continue
        if verify:
            from holedger.replay.engine import replay_run

            ok = replay_run(ledger, info.run_id).verified
            gain = RunGain(**{**gain.__dict__, "verified": ok})
            if not ok:
                if excluded is not None:
                    excluded.append(info.run_id)
                continue
        gains.append(gain)
    return gains


def summarize(gains: Iterable[RunGain]) -> list[GroupSummary]:
    groups: dict[tuple[str, str], GroupSummary] = defaultdict(lambda: GroupSummary("", ""))
    for gain in gains:
        key = (gain.task_id, gain.optimizer)
        group = groups[key]
        group.task_id, group.optimizer = key
        if gain.g is None:
            group.undefined += 1
            continue
        group.gains.append(gain.g)
        group.above += int(gain.above_band)
    return [groups[key] for key in sorted(groups)]
