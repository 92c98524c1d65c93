"""A request's case ids x attempts are listed only when they have trials to match.

A rejected request costs nothing and may name any number of attempts; an accepted one is
bounded by the budget. Listing the pairs of a request naming 2**52 attempts would keep
replay (and its memory) busy without end, so one bad request would make a run unauditable.
"""

from __future__ import annotations

from collections.abc import Callable

from holedger.ledger.store import Ledger
from holedger.replay.checks.order import MAX_REQUEST_TRIALS
from holedger.replay.report import ReplayReport

from .runs import DEV, RunWriter, terms

SEED = "a" * 40


def test_an_accepted_request_past_any_run_is_refused_not_listed(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    writer.commit(SEED)
    writer.request(
        SEED, "dev", [DEV[0].id], MAX_REQUEST_TRIALS + 1, decision="accepted", reason=None
    )
    writer.close()
    report = replay(writer.run_id)
    assert not report.verified
    assert any("more than any run may hold" in f.reason for f in report.failures), report.failures


def test_a_rejected_request_naming_2_52_attempts_replays(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    writer.commit(SEED)
    writer.request(SEED, "dev", [DEV[0].id], 2**52)  # the budget rejects it
    writer.close()
    report = replay(writer.run_id)
    assert report.verified, report.failures
