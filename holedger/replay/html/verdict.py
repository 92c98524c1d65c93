"""What replay concluded about a run, typed for the report: the verdict, the named checks
and failures, and the figures of the checks' sections the page shows.

The replay report keeps each check's section as JSON-shaped data (what ``replay --json``
prints); :func:`verification` reads the ones the page shows into frozen values, here and
nowhere else, so a section of the page reads fields, never keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from holedger.numbers import exact
from holedger.replay.report import CheckResult, Failure, ReplayReport


@dataclass(frozen=True)
class BudgetRow:
    component: str
    used: Fraction | None
    limit: Fraction | None


@dataclass(frozen=True)
class SafetyCounts:
    violations: int
    by_category: tuple[tuple[str, int], ...]
    trials: int
    unisolated: int
    not_run: int


@dataclass(frozen=True)
class ShownFinding:
    """A projection shown to the optimizer that holds held-out items."""

    seq: int | None
    request_id: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class ScanFinding:
    """A committed file that holds held-out items: where, as ``line N: matches`` text."""

    index: str
    file: str
    kind: str
    items: str
    where: str


@dataclass(frozen=True)
class LeakagePart:
    status: str
    reason: str | None
    findings: tuple[ShownFinding | ScanFinding, ...]


@dataclass(frozen=True)
class Leakage:
    audit: LeakagePart | None
    candidate_scan: LeakagePart | None
    lists_shown: bool  # whether the audit listed what the optimizer was shown
    rules: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ScoresCheck:
    """The held-out scores as the scores check recomputed them (None: not recomputed)."""

    e_h_plus: Fraction | None
    e_h0: Fraction | None
    g: Fraction | None
    band: Fraction | None
    band_outcome: str | None  # resolved gain, indistinguishable from 0, resolved loss


@dataclass(frozen=True)
class BaselineCheck:
    checked: bool
    reason: str | None
    run_id: str | None
    verified: bool
    matches: bool


@dataclass(frozen=True)
class GatewayCheck:
    calls: int
    target_tokens: int
    target_cap: str
    optimizer_tokens: int
    overshoot: str


@dataclass(frozen=True)
class Verification:
    """The replay report as the page shows it."""

    run_id: str
    verified: bool
    verdict: str  # verified, verified-aborted or failed
    events: int
    checks: tuple[CheckResult, ...] = ()
    failures: tuple[Failure, ...] = ()
    failures_total: int = 0
    judged_on: str = ""
    trust: tuple[str, tuple[str, ...]] | None = None  # where the keys came from, the keys
    budget: tuple[BudgetRow, ...] = ()
    safety: SafetyCounts | None = None
    leakage: Leakage | None = None
    scores: ScoresCheck | None = None
    baseline: BaselineCheck | None = None
    rescored: tuple[str, str | None] | None = None  # status, reason
    gateway: GatewayCheck | None = None
    closed: tuple[str, str | None] | None = None  # reason, why

    @property
    def aborted(self) -> bool:
        return self.verdict == "verified-aborted"

    def named(self, *names: str) -> list[CheckResult]:
        return [c for c in self.checks if c.name in names]


def verification(report: ReplayReport) -> Verification:
    """The typed view of ``report``."""
    s = report.sections
    trust = _dict(s.get("trust"))
    closed = _dict(s.get("closed"))
    rescored = _dict(s.get("rescored"))
    return Verification(
        report.run_id,
        report.verified,
        report.verdict,
        report.events,
        tuple(report.checks),
        tuple(report.failures),
        report.failures_total,
        report.judged_on,
        None if trust is None else (str(trust.get("source", "?")), _strs(trust.get("keys"))),
        _budget(s.get("budget_table")),
        _safety(_dict(s.get("safety"))),
        _leakage(_dict(s.get("leakage"))),
        _scores(_dict(s.get("scores"))),
        _baseline(_dict(s.get("baseline"))),
        None
        if rescored is None
        else (str(rescored.get("status", "?")), _opt_str(rescored.get("reason"))),
        _gateway(_dict(s.get("gateway"))),
        None if closed is None else (str(closed.get("reason", "?")), _opt_str(closed.get("why"))),
    )


def _dict(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def _opt_str(value: object) -> str | None:
    return str(value) if value else None


def _strs(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _budget(rows: object) -> tuple[BudgetRow, ...]:
    if not isinstance(rows, list):
        return ()
    return tuple(
        BudgetRow(str(r.get("component", "?")), exact(r.get("used")), exact(r.get("limit")))
        for r in rows
        if isinstance(r, dict)
    )


def _safety(s: Mapping[str, Any] | None) -> SafetyCounts | None:
    if s is None:
        return None
    by_cat = _dict(s.get("by_category")) or {}
    return SafetyCounts(
        _int(s.get("violations", 0)),
        tuple((str(k), _int(v)) for k, v in by_cat.items()),
        _int(s.get("trials", 0)),
        _int(s.get("unisolated_trials", 0)),
        _int(s.get("not_run_trials", 0)),
    )


def _leakage(s: Mapping[str, Any] | None) -> Leakage | None:
    if s is None:
        return None
    rules = _dict(s.get("rules")) or {}
    return Leakage(
        _part("audit", _dict(s.get("audit"))),
        _part("candidate_scan", _dict(s.get("candidate_scan"))),
        isinstance(s.get("shown"), list),
        tuple((str(k), str(v)) for k, v in rules.items()),
    )


def _part(part: str, info: Mapping[str, Any] | None) -> LeakagePart | None:
    if info is None:
        return None
    findings: list[ShownFinding | ScanFinding] = []
    for f in info.get("findings") or []:
        if not isinstance(f, dict):
            continue
        if part == "audit":
            seq = f.get("seq")
            findings.append(
                ShownFinding(
                    seq if isinstance(seq, int) else None,
                    str(f.get("request_id")),
                    _strs(f.get("items")),
                )
            )
            continue
        where = "; ".join(
            f"line {ln.get('line')}: {', '.join(str(m) for m in ln.get('matches') or [])}"
            for ln in f.get("lines") or []
            if isinstance(ln, dict)
        )
        findings.append(
            ScanFinding(
                f"#{f.get('index')}",
                str(f.get("file")),
                str(f.get("kind")),
                str(f.get("items")),
                where,
            )
        )
    return LeakagePart(str(info.get("status", "?")), _opt_str(info.get("reason")), tuple(findings))


def _scores(s: Mapping[str, Any] | None) -> ScoresCheck | None:
    if s is None:
        return None
    outcome = s.get("band_outcome")
    return ScoresCheck(
        exact(s.get("e_h_plus")),
        exact(s.get("e_h0")),
        exact(s.get("g")),
        exact(s.get("resolution_band")),
        outcome if isinstance(outcome, str) else None,
    )


def _baseline(s: Mapping[str, Any] | None) -> BaselineCheck | None:
    if s is None:
        return None
    return BaselineCheck(
        s.get("checked") is not False,
        _opt_str(s.get("reason")),
        _opt_str(s.get("run_id")),
        bool(s.get("verified")),
        bool(s.get("matches")),
    )


def _gateway(s: Mapping[str, Any] | None) -> GatewayCheck | None:
    if s is None:
        return None
    return GatewayCheck(
        _int(s.get("calls", 0)),
        _int((_dict(s.get("target_tokens")) or {}).get("total", 0)),
        str(s.get("target_cap", "-")),
        _int((_dict(s.get("optimizer_tokens")) or {}).get("total", 0)),
        str(s.get("overshoot", 0)),
    )
