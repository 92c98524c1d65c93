"""A trial killed at its time limit scores 0 unless the task's terms say otherwise: a
real harness that prints its answer and then runs past the limit, in the process backend."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.sandboxes import get_backend
from holedger.sandboxes.spec import Limits, SandboxSpec
from holedger.schemas.events import TokenUsage
from holedger.server.executor import LocalExecutor
from holedger.server.trials import GatewayUsage, TrialRef, TrialRunner

ANSWERS_THEN_HANGS = (
    "import json, sys, time\nprint(json.dumps({'answer': 'right'}), flush=True)\ntime.sleep(60)\n"
)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    yield led
    led.close()


def _verify(case_id: str, answer: Any) -> Fraction:
    return Fraction(1) if answer == {"answer": "right"} else Fraction(0)


def _outcome(ledger: Ledger, tmp_path: Path, rule: str | None) -> Any:
    (tmp_path / "h.py").write_text(ANSWERS_THEN_HANGS)
    backend = get_backend("process")
    limits = Limits(wall_s=1)
    result = backend.run(
        SandboxSpec(
            code_dir=tmp_path,
            argv=[sys.executable, "h.py"],
            stdin=b"{}\n",
            env={},
            relays={},
            limits=limits,
            label="timeout",
        )
    )
    assert result.timed_out and b"right" in result.stdout
    runner = TrialRunner(
        ledger=ledger,
        repo=None,  # type: ignore[arg-type]  (no checkout: the result is given)
        executor=LocalExecutor(),
        backend=backend.name,
        entrypoint=[sys.executable, "h.py"],
        model="m",
        limits=limits,
        verify=_verify,
        timeout_score=rule,
    )
    plan = TrialRef("r", "req-1", "req-1/c/0", "c" * 40, "dev", "c", 0, {})
    return runner._outcome(plan, result, GatewayUsage(TokenUsage(), 0))


def test_a_timed_out_trial_scores_zero_by_default(ledger: Ledger, tmp_path: Path) -> None:
    completed = _outcome(ledger, tmp_path, "zero").completed
    assert completed.timed_out and completed.answer_digest is not None
    assert completed.score == 0


def test_terms_that_say_verifier_score_a_timed_out_answer(ledger: Ledger, tmp_path: Path) -> None:
    assert _outcome(ledger, tmp_path, "verifier").completed.score == 1
