"""The gateway projection keeps integer columns: sums past 64 bits stay exact, and
settlements arriving out of reservation order are re-derived correctly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.report import ReplayReport, ReportBuilder
from holedger.schemas.events import GatewayBudgetState, GatewayCall, TokenUsage

BIG = 2**52


def context(cap: int, trial_cap: int | None = None) -> Any:
    budget = SimpleNamespace(target_tokens=cap, per_trial_tokens=trial_cap, optimizer_tokens=None)
    return SimpleNamespace(
        opened=SimpleNamespace(terms=SimpleNamespace(models=["m"], budget=budget))
    )


def settled_call(
    index: int, trial: str, tokens: TokenUsage, reserved: int, state: GatewayBudgetState
) -> GatewayCall:
    return GatewayCall(
        call_id=f"call-{index}",
        scope="target",
        trial_id=trial,
        model_requested="m",
        model_served="m",
        allowed=True,
        status=200,
        tokens=tokens,
        reserved=reserved,
        latency_ms=1,
        request_digest=None,
        response_digest=None,
        reservation_index=index,
        budget=state,
    )


def replay(projection: GatewayFold, calls: list[GatewayCall]) -> ReplayReport:
    for seq, call in enumerate(calls, start=1):
        projection.apply(SimpleNamespace(seq=seq), call)  # type: ignore[arg-type]
    out = ReportBuilder()
    projection.finish(out)
    return out.build("run", len(calls))


def test_sums_past_64_bits_are_exact() -> None:
    cap = 2**53 - 1
    usage = TokenUsage(input=BIG, output=BIG - 1, total=2 * BIG - 1)
    calls = [
        settled_call(
            k,
            "t1",
            usage,
            cap,
            GatewayBudgetState(cap=cap, settled=0, outstanding=0, settled_calls=k, reservations=k),
        )
        for k in range(1100)
    ]
    report = replay(GatewayFold(context(cap)), calls)
    total = 1100 * (2 * BIG - 1)
    assert total > 2**63
    assert report.sections["gateway"]["target_settled"] == total
    assert report.sections["gateway"]["target_tokens"]["input"] == 1100 * BIG
    cap_check = next(c for c in report.checks if c.name == "gateway_cap")
    assert not cap_check.ok
    assert cap_check.detail == f"settled target tokens {total} exceed the cap {cap}"


def test_settlements_out_of_reservation_order_are_rederived() -> None:
    def state(settled: int, outstanding: int, n: int, r: int, t_set: int, t_out: int) -> Any:
        return GatewayBudgetState(
            cap=1000,
            settled=settled,
            outstanding=outstanding,
            settled_calls=n,
            reservations=r,
            trial_cap=500,
            trial_settled=t_set,
            trial_outstanding=t_out,
        )

    used = TokenUsage(input=30, output=10, total=40)
    # Reservation 0 (trial a, 100) is taken first but settles last; reservation 1 (trial b,
    # 200) saw it outstanding; reservation 2 (trial a, 50) saw 0 outstanding and 1 settled.
    calls = [
        settled_call(1, "b", used, 200, state(0, 100, 0, 1, 0, 0)),
        settled_call(2, "a", used, 50, state(40, 100, 1, 2, 0, 100)),
        settled_call(0, "a", used, 100, state(0, 0, 0, 0, 0, 0)),
    ]
    report = replay(GatewayFold(context(1000, 500)), calls)
    assert report.verified, report.failures
    # The same run with reservation 2's recorded outstanding understated fails on it.
    calls[1] = settled_call(2, "a", used, 50, state(40, 0, 1, 2, 0, 100))
    report = replay(GatewayFold(context(1000, 500)), calls)
    assert not report.verified
    assert [(f.seq, f.check) for f in report.failures] == [(2, "gateway_budget")]
    assert report.failures[0].reason.startswith("recorded budget state settled 40 + outstanding 0")


def test_indices_past_32_bits_widen_their_column_and_are_reported() -> None:
    """Columns start 32-bit; a forged index of 2**40 widens them instead of crashing."""
    cap = 10**6
    usage = TokenUsage(input=3, output=2, total=5)
    state = GatewayBudgetState(cap=cap, settled=0, outstanding=0, settled_calls=0, reservations=0)
    calls = [settled_call(0, "t1", usage, 10, state), settled_call(2**40, "t1", usage, 10, state)]
    projection = GatewayFold(context(cap))
    report = replay(projection, calls)
    assert projection._s_index.typecode == "q"
    assert list(projection._s_index) == [0, 2**40]
    reasons = [f.reason for f in report.failures if f.check == "gateway_budget"]
    assert any("reservation indices are not 0..M-1" in r for r in reasons)
