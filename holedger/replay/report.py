"""The replay report: a verdict, named checks, the first failures, and sections."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from holedger.numbers import Mean, decimal, exact, quantities_for_json

MAX_FAILURES = 50


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it needs: "1 projection", "2 projections"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def score_text(value: object) -> str:
    """A score, gain or band for people, by the one rule of ``holedger.numbers``: three
    decimals (``0.368``, ``1.000``); ``-`` when there is none. ``--json`` has the exact
    rational."""
    return decimal(value)


def scores_mean_text(section: dict[str, Any], key: str) -> str:
    """E(H+) or E(H0) of a ``scores`` section with its counts: each of the section's
    ``cases`` test cases scored K times (the pinned baseline with the same K on the same
    split), ``0.812: 117 of 144 trials over 48 cases``."""
    value = exact(section.get(key))
    cases, k = section.get("cases"), section.get("k")
    if value is None or not isinstance(cases, int) or not isinstance(k, int) or not cases:
        return score_text(section.get(key))
    return Mean.of(value, cases, k).text()


# The quantities (exact rational strings) of each report section, which ``--json`` gives
# as a number and an exact string side by side (holedger.numbers).
SECTION_QUANTITIES: dict[str, tuple[str, ...]] = {
    "scores": ("e_h_plus", "e_h0", "g", "resolution_band"),
    "budget_table": ("used", "limit"),
}


class CheckResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    ok: bool
    detail: str
    level: Literal["error", "warning"] = "error"


class Failure(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq: int | None
    type: str | None
    reason: str
    check: str


class ReplayReport(BaseModel):
    """What ``holedger replay --json`` prints (sections are added by projections)."""

    run_id: str
    verified: bool
    events: int
    checks: list[CheckResult]
    failures: list[Failure]
    failures_total: int = 0
    sections: dict[str, Any] = {}
    # After a break in the log: "[judged on seq 0 to N only, ...] ", the note the checks
    # judged on the intact prefix carry, for the lines printed from the sections too (not
    # a member of the JSON report, whose check details and failures carry it already).
    _judged_on: str = PrivateAttr(default="")

    @property
    def judged_on(self) -> str:
        return self._judged_on

    @property
    def aborted(self) -> bool:
        """Closed by ``holedger run abort`` (RunClosed reason ``aborted``): no score."""
        closed = self.sections.get("closed")
        return isinstance(closed, dict) and closed.get("reason") == "aborted"

    @property
    def verdict(self) -> str:
        """``verified``, ``verified-aborted`` (a verified log of a run that was abandoned:
        it has no score to use) or ``failed``."""
        if not self.verified:
            return "failed"
        return "verified-aborted" if self.aborted else "verified"

    @property
    def verdict_text(self) -> str:
        """The verdict as the text outputs print it (rich markup)."""
        if not self.verified:
            return "[bold red]FAILED[/]"
        return "[bold yellow]VERIFIED (aborted)[/]" if self.aborted else "[bold green]VERIFIED[/]"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "verified": self.verified,
            "verdict": self.verdict,
            "aborted": self.aborted,
            "events": self.events,
            "checks": [c.model_dump() for c in self.checks],
            "warnings": [c.name for c in self.checks if c.level == "warning" and not c.ok],
            "failures": [f.model_dump() for f in self.failures],
            "failures_total": self.failures_total,
        }
        for name, section in self.sections.items():
            data.setdefault(name, quantities_for_json(section, SECTION_QUANTITIES.get(name, ())))
        return data

    def failed_checks(self) -> list[str]:
        """The checks that failed the verdict (warnings, such as isolation, are not)."""
        return [c.name for c in self.checks if not c.ok and c.level == "error"]


class ReportBuilder:
    """Collects checks, failures and sections while a run is replayed.

    A check named once stays failed once any failure names it: ``fail`` marks its
    check failed, ``check`` records an explicit verdict with a detail line.
    """

    def __init__(self) -> None:
        self._checks: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._warnings: set[str] = set()
        self._counts: dict[str, int] = {}
        self.failures: list[Failure] = []
        self.failures_total = 0
        self.sections: dict[str, Any] = {}
        self.judged_on = ""

    def declare(self, name: str, detail: str = "") -> None:
        """Name a check that passes unless something fails it."""
        if name not in self._checks:
            self._checks[name] = (True, detail)

    def check(self, name: str, ok: bool, detail: str) -> None:
        previous_ok = self._checks.get(name, (True, ""))[0]
        self._checks[name] = (previous_ok and ok, detail)

    def fail(self, seq: int | None, event_type: str | None, reason: str, *, check: str) -> None:
        ok, detail = self._checks.get(name := check, (True, ""))
        self._counts[name] = self._counts.get(name, 0) + 1
        if ok:
            detail = reason if seq is None else f"seq {seq}: {reason}"
        self._checks[name] = (False, detail)
        self.failures_total += 1
        if len(self.failures) < MAX_FAILURES:  # the first found: the break is among them
            self.failures.append(Failure(seq=seq, type=event_type, reason=reason, check=check))

    def warn(self, name: str, ok: bool, detail: str) -> None:
        """A check that is reported but does not change the verdict (e.g. isolation)."""
        self._warnings.add(name)
        self.check(name, ok, detail)

    def qualify(self, keep: set[str], note: str) -> None:
        """Put ``note`` before the detail of every check not in ``keep`` and before the
        reason of every failure such a check names: what they say was judged on part of
        the run only."""
        self.judged_on = note
        for name, (ok, detail) in self._checks.items():
            if name not in keep:
                self._checks[name] = (ok, note + detail)
        self.failures = [
            f if f.check in keep else f.model_copy(update={"reason": note + f.reason})
            for f in self.failures
        ]

    def ok(self, name: str) -> bool:
        return self._checks.get(name, (True, ""))[0]

    def section(self, name: str, data: Any) -> None:
        self.sections[name] = data

    def build(self, run_id: str, events: int) -> ReplayReport:
        checks = []
        for name, (ok, detail) in self._checks.items():
            count = self._counts.get(name, 0)
            if count > 1:
                detail = f"{detail} (and {count - 1} more)"
            level: Literal["error", "warning"] = "warning" if name in self._warnings else "error"
            checks.append(CheckResult(name=name, ok=ok, detail=detail, level=level))
        verified = all(c.ok for c in checks if c.level == "error")
        report = ReplayReport(
            run_id=run_id,
            verified=verified,
            events=events,
            checks=checks,
            failures=sorted(self.failures, key=_by_seq),
            failures_total=self.failures_total,
            sections=self.sections,
        )
        report._judged_on = self.judged_on
        return report


def _by_seq(failure: Failure) -> tuple[bool, int]:
    """Failures in the order of the log (those of no event last); found in the same
    event, in the order they were found (the sort is stable)."""
    return (failure.seq is None, failure.seq or 0)
