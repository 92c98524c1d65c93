"""Harness-updating and harness-benefit, read from scored runs.

Two capabilities are told apart (after arXiv 2605.30621, "Harness Updating Is Not Harness
Benefit"): *harness-updating*, how much the harness updates an optimizer (the evolver)
writes help, and *harness-benefit*, how much a target model (the agent) gains from updated
harnesses. A holedger run pairs one of each: its optimizer label, and the target models its
task pins (``TaskTerms.models``). Its held-out gain is

    delta = E(H+) - E(H0)

(the raw difference of held-out scores; ``points`` is 100 x delta). The tables below
group runs per task; `holedger analysis capabilities` reports from them the paper's
measures (:mod:`holedger.analysis.updating`: benefit the max over anchor evolvers, not
the column mean kept here as a summary). Per task:

* the cell (optimizer o, agent a) is the mean delta over o's scored runs on a;
* harness-updating of o is the mean over agents of its cells (a row mean);
* harness-benefit of a is the mean over optimizers of its cells (a column mean);
* the updating spread is the largest minus the smallest harness-updating among the
  optimizers whose row is complete.

An agent is a (target models, task digest) pair: a task pins its models, so two target
models are two task digests, and two versions of a task with the same models are two
agents too (never pooled). A row or column with a missing cell is averaged over the cells
it has and marked ``complete: false``: it is then a mean over another set of agents (or
optimizers) than its neighbours', and the spread leaves it out. Runs come from
:mod:`holedger.analysis.gains` (closed and scored; baselines left out; optionally only the
runs that replay verifies). Every mean is an exact rational.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.analysis.gains import RunGain
from holedger.protocol.rules import BASELINE_OPTIMIZER
from holedger.schemas.canonical import rational_to_str

Agent = tuple[tuple[str, ...], str]  # (target models, task digest)


def _mean(values: list[Fraction]) -> Fraction:
    return sum(values, Fraction(0)) / len(values)


def _number(value: Fraction | None) -> dict[str, Any]:
    """An exact value and its float in points, as the JSON carries each mean."""
    if value is None:
        return {"delta": None, "delta_exact": None, "points": None}
    return {
        "delta": float(value),
        "delta_exact": rational_to_str(value),
        "points": float(value * 100),
    }


@dataclass
class TaskCapabilities:
    """The optimizer x agent table of one task, with its row and column means."""

    task_id: str
    cells: dict[tuple[str, Agent], list[RunGain]] = field(default_factory=dict)

    @property
    def optimizers(self) -> list[str]:
        return sorted({o for o, _ in self.cells})

    @property
    def agents(self) -> list[Agent]:
        return sorted({a for _, a in self.cells})

    def cell(self, optimizer: str, agent: Agent) -> Fraction | None:
        runs = self.cells.get((optimizer, agent))
        return None if not runs else _mean([r.e_h_plus - r.e_h0 for r in runs])

    def updating(self, optimizer: str) -> tuple[Fraction | None, int, bool]:
        """Harness-updating of ``optimizer``: (mean over its agents, agents, complete)."""
        values = [v for a in self.agents if (v := self.cell(optimizer, a)) is not None]
        mean = _mean(values) if values else None
        return mean, len(values), len(values) == len(self.agents)

    def benefit(self, agent: Agent) -> tuple[Fraction | None, int, bool]:
        """Harness-benefit of ``agent``: (mean over its optimizers, optimizers, complete)."""
        values = [v for o in self.optimizers if (v := self.cell(o, agent)) is not None]
        mean = _mean(values) if values else None
        return mean, len(values), len(values) == len(self.optimizers)

    def spread(self) -> Fraction | None:
        """Largest minus smallest harness-updating over the complete rows (two or more)."""
        complete = [
            mean
            for o in self.optimizers
            for mean, _, whole in [self.updating(o)]
            if whole and mean is not None
        ]
        return max(complete) - min(complete) if len(complete) >= 2 else None

    def to_json(self) -> dict[str, Any]:
        agents = self.agents
        return {
            "task_id": self.task_id,
            "agents": [
                {
                    "models": list(models),
                    "task_digest": digest,
                    "e_h0": rational_to_str(e0[0]) if len(e0) == 1 else None,
                    "e_h0_values": [rational_to_str(v) for v in e0],
                }
                for models, digest in agents
                for e0 in [self._e_h0((models, digest))]
            ],
            "optimizers": self.optimizers,
            "cells": [
                {
                    "optimizer": o,
                    "models": list(a[0]),
                    "task_digest": a[1],
                    "runs": len(runs),
                    **_number(self.cell(o, a)),
                }
                for (o, a), runs in sorted(self.cells.items())
            ],
            "updating": [
                {"optimizer": o, **_number(mean), "agents": n, "complete": whole}
                for o in self.optimizers
                for mean, n, whole in [self.updating(o)]
            ],
            "benefit": [
                {
                    "models": list(a[0]),
                    "task_digest": a[1],
                    **_number(mean),
                    "optimizers": n,
                    "complete": whole,
                }
                for a in agents
                for mean, n, whole in [self.benefit(a)]
            ],
            "updating_spread": _number(self.spread()),
        }

    def _e_h0(self, agent: Agent) -> list[Fraction]:
        """The seed's pinned scores in ``agent``'s runs, distinct and sorted: one value when
        they all pin the same seed baseline (runs of one home do), more when runs gathered
        from several homes or bundles pinned baselines of their own."""
        return sorted({r.e_h0 for (_, a), runs in self.cells.items() if a == agent for r in runs})


def capabilities(gains: Iterable[RunGain]) -> list[TaskCapabilities]:
    """The per-task tables of ``gains`` (scored runs; seed-baseline runs are skipped)."""
    tasks: dict[str, TaskCapabilities] = defaultdict(lambda: TaskCapabilities(""))
    for gain in gains:
        if gain.optimizer == BASELINE_OPTIMIZER:
            continue  # the seed scored against itself: no harness was updated
        table = tasks[gain.task_id]
        table.task_id = gain.task_id
        agent: Agent = (tuple(sorted(gain.models)), gain.task_digest)
        table.cells.setdefault((gain.optimizer, agent), []).append(gain)
    return [tasks[t] for t in sorted(tasks)]


def agent_label(agent: Agent) -> str:
    """An agent for a table heading: its model(s) and the task digest's first characters."""
    models, digest = agent
    return f"{'+'.join(models)} [{digest[:8]}]"
