"""Who may sign what (``roles``): RunOpened declares a key per role, and a role's key
speaks only for that role. The gateway signs the calls it forwards or refuses
(GatewayCall) and what it saw a harness attempt (SafetyViolation); the sandbox signs only
what it saw a harness attempt (SafetyViolation); every other event is the server's word
(its decisions, trials, scores, reads, checkpoints). An event of any other type signed by
the gateway or sandbox role fails: with keys held apart, a gateway or sandbox key must not
be able to record a trial, a score or a nomination.
"""

from __future__ import annotations

from holedger.ledger.records import Record
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import Model

CHECK = "roles"
# Event types a role other than the server may sign, by role.
SIGNS: dict[str, frozenset[str]] = {
    "server": frozenset(),  # the server may sign any event
    "gateway": frozenset({"GatewayCall", "SafetyViolation"}),
    "sandbox": frozenset({"SafetyViolation"}),
}


class RolesFold:
    name = CHECK

    def __init__(self, ctx: CheckContext) -> None:
        self.failures: list[tuple[int, str, str]] = []
        self.others = 0

    def apply(self, rec: Record, payload: Model) -> None:
        if rec.role == "server":
            return
        self.others += 1
        if rec.type not in SIGNS.get(rec.role, frozenset()):
            self.failures.append(
                (
                    rec.seq,
                    rec.type,
                    f"{rec.type} signed by the {rec.role}: only the server signs it",
                )
            )

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "each event is signed by a role that may record it")
        for seq, etype, reason in self.failures:
            out.fail(seq, etype, reason, check=CHECK)
        if not self.failures:
            out.check(
                CHECK,
                True,
                f"{counted(self.others, 'event')} signed by the gateway or the sandbox, each "
                "a call or a safety violation; every other by the server",
            )
