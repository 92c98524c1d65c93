"""`holedger campaign verify`: replay every run a campaign recorded, and check the grid.

Each run with the campaign's label is replayed as `holedger replay` does (its keys pinned
to the home's key). The grid holds when every run verifies, every cell has exactly one
completed run, and no trial id is recorded twice in the campaign.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from holedger.config import Settings
from holedger.demo.campaign_tasks import task_refs
from holedger.demo.grid import Grid
from holedger.errors import NotFoundError


@dataclass
class CampaignCheck:
    grid: Grid
    runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rows(self) -> list[list[str]]:
        return [
            [r["run_id"], r["cell"], r["state"], "VERIFIED" if r["verified"] else "FAILED"]
            for r in self.runs
        ]

    def headline(self) -> str:
        verified = sum(r["verified"] for r in self.runs)
        completed = sum(r["state"] == "closed" for r in self.runs)
        state = "holds" if self.ok else "DOES NOT hold"
        return (
            f"campaign {self.grid.name}: {verified} of {len(self.runs)} runs verify, "
            f"{completed} completed of {len(self.grid.cells)} cells: the grid {state}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "campaign": self.grid.name,
            "ok": self.ok,
            "cells": len(self.grid.cells),
            "runs": self.runs,
            "problems": self.problems,
        }


def verify_campaign(cfg: Settings, grid: Grid) -> CampaignCheck:
    from holedger.demo.report import replay_in_home
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger
    from holedger.server.taskview import load_server_task

    if not cfg.key_path.exists():
        raise NotFoundError(f"no home at {cfg.home}", hint="run the campaign first")
    check = CampaignCheck(grid)
    key = SigningKey.load(cfg.key_path).public
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        loads = task_refs(cfg, grid.tasks, grid.test_cases)
        task_ids = {load_server_task(loads[ref]).terms.task_id: ref for ref in grid.tasks}
        completed: Counter[tuple[Any, ...]] = Counter()
        trials: Counter[str] = Counter()
        for info in ledger.runs():
            if info.optimizer != grid.label:
                continue
            opened = ledger.run_terms(info.run_id)
            d = opened.descriptor
            cell = "?"
            if d is not None and opened.task_id in task_ids:
                key_ = (task_ids[opened.task_id], d.model, d.harness, d.harness_scope, d.replicate)
                cell = f"{key_[0]}/{d.model}/{d.harness}#{d.replicate}"
                if info.state == "closed":
                    completed[key_] += 1
            report = replay_in_home(cfg, ledger, info.run_id, trusted_keys=[key])
            for rec in ledger.records(info.run_id):
                if rec.type == "TrialCompleted":
                    trials[str(rec.payload["trial_id"])] += 1
            check.runs.append(
                {
                    "run_id": info.run_id,
                    "cell": cell,
                    "state": info.state,
                    "verified": report.verified,
                }
            )
            if not report.verified:
                check.problems.append(f"run {info.run_id} ({cell}) does not verify")
        for c in grid.cells:
            if completed[c.key] != 1:
                check.problems.append(f"cell {c.name} has {completed[c.key]} completed runs")
        twice = sorted(t for t, n in trials.items() if n > 1)
        if twice:
            check.problems.append(f"{len(twice)} trial ids recorded twice, e.g. {twice[0]}")
    finally:
        ledger.close()
    return check
