"""The budget projection: re-derive budget use after every request and re-decide each one.

For each EvaluationRequested, in log order, replay recomputes the cost with
``rules.request_cost``, compares the recorded ``budget_before`` with the use folded from
the accepted requests before it, and re-takes the decision with ``rules.request_problem``
and ``rules.budget_decision``, comparing the refusal's code with the recorded one (never
its text). A rejection is also right when the candidate was never
committed (the server cannot evaluate what does not exist). The section ``budget_table``
holds used / limit / percent per component, target tokens from the gateway's calls.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.protocol.refusals import legacy_code
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.replay.taskdata import TaskData, task_data
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    EvaluationRequested,
    GatewayCall,
    Model,
)

CHECK = "budget"


class BudgetFold:
    name = "budget"

    def __init__(self, ctx: CheckContext) -> None:
        self.terms = ctx.opened.terms
        self.ctx = ctx
        self.used = rules.no_use()
        self.committed: set[str] = set()
        self.nominated = False
        self.requests = 0
        self.accepted = 0
        self.rejected = 0
        self.target_tokens = 0
        self.target_calls = 0
        self.failures: list[tuple[int, str]] = []
        self._known: dict[str, set[str]] | None = None

    def _known_cases(self, split: str) -> set[str] | None:
        if self._known is None:
            data = task_data(self.ctx)
            self._known = (
                {s: data.ids(s) for s in ("dev", "val", "test")}
                if isinstance(data, TaskData)
                else {}
            )
        return self._known.get(split)

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted):
            self.committed.add(payload.candidate)
        elif isinstance(payload, CandidateNominated):
            self.nominated = True
        elif isinstance(payload, GatewayCall):
            if payload.scope == "target":
                self.target_calls += 1
                self.target_tokens += payload.tokens.total
        elif isinstance(payload, EvaluationRequested):
            self._request(rec.seq, payload)

    def _request(self, seq: int, req: EvaluationRequested) -> None:
        self.requests += 1
        size = self.terms.split_sizes.get(req.split, 0)
        if size < 1:
            self.failures.append((seq, f"request {req.request_id}: split {req.split} is empty"))
            return
        cost = rules.request_cost(size, len(req.case_ids), req.attempts)
        if req.cost != cost:
            self.failures.append(
                (
                    seq,
                    f"request {req.request_id}: recorded cost {_cost(req.cost)} "
                    f"is not the rule's {_cost(cost)}",
                )
            )
        if req.budget_before != self.used:
            self.failures.append(
                (
                    seq,
                    f"request {req.request_id}: recorded budget_before {_use(req.budget_before)} "
                    f"is not the re-derived {_use(self.used)}",
                )
            )
        refusal = rules.request_problem(
            self.terms,
            req.split,
            req.case_ids,
            req.attempts,
            nominated=self.nominated,
            known_cases=self._known_cases(req.split),
        )
        if refusal is None and self.ctx.opened.solve_evolve is None:
            # (a solve-evolve run's steps are bounded by its pinned stream instead: the
            # solve_evolve checks judge them, and its use is shown here all the same)
            refusal = rules.budget_decision(self.terms.budget, self.used, req.split, cost)
        if req.decision == "accepted":
            self.accepted += 1
            if refusal is not None:
                self.failures.append((seq, f"request {req.request_id} was accepted but {refusal}"))
            self.used = rules.add_use(self.used, req.split, cost)
            return
        self.rejected += 1
        if req.candidate not in self.committed and req.reason:
            return  # nothing to evaluate: any stated reason is right
        if refusal is None:
            self.failures.append(
                (
                    seq,
                    f"request {req.request_id} was rejected ({req.reason}) "
                    "but fits the budget and the rules",
                )
            )
            return
        # Codes are compared, never text; a log from before codes has its code read off
        # the reason by the wording of that time.
        recorded = req.code if req.code is not None else legacy_code(req.reason)
        if recorded != refusal.code:
            self.failures.append(
                (
                    seq,
                    f"request {req.request_id} was rejected with code {recorded} "
                    f"({req.reason!r}), the rules say {refusal.code} ({refusal.text!r})",
                )
            )

    def table(self) -> list[dict[str, Any]]:
        budget = self.terms.budget
        rows = []
        for split in ("dev", "val"):
            limit = getattr(budget, split)
            spent = getattr(self.used, split)
            rows.append(_row(f"{split} calls", Fraction(spent.calls), Fraction(limit.calls)))
            rows.append(_row(f"{split} case_passes", spent.case_passes, limit.case_passes))
        if budget.target_tokens or self.target_calls:
            rows.append(
                _row("target tokens", Fraction(self.target_tokens), Fraction(budget.target_tokens))
            )
        return rows

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "budget use re-derived after every request; each decision re-taken")
        for seq, reason in self.failures:
            out.fail(seq, "EvaluationRequested", reason, check=CHECK)
        if not self.failures:
            out.check(
                CHECK,
                True,
                f"{counted(self.requests, 'request')} re-decided ({self.accepted} accepted, "
                f"{self.rejected} rejected): every cost, budget_before and decision agrees",
            )
        out.section("budget_table", self.table())


def _row(component: str, used: Fraction, limit: Fraction) -> dict[str, Any]:
    percent = "-" if limit == 0 else f"{float(used * 100 / limit):.1f}%"
    return {
        "component": component,
        "used": rational_to_str(used),
        "limit": rational_to_str(limit),
        "percent": percent,
    }


def _cost(cost: Any) -> str:
    return f"calls {cost.calls}, case_passes {rational_to_str(cost.case_passes)}"


def _use(use: Any) -> str:
    return (
        f"dev {use.dev.calls} calls/{rational_to_str(use.dev.case_passes)} case_passes, "
        f"val {use.val.calls} calls/{rational_to_str(use.val.case_passes)} case_passes"
    )
