"""A small closed run with task terms, for the command-line tests."""

from __future__ import annotations

from sample_terms import task_terms

from holedger.ledger.store import Ledger


def closed_task_run(ledger: Ledger) -> str:
    """Open and close a run with task terms: three events that replay verifies whole."""
    digest = "ab" * 32
    terms = task_terms(
        "cli-task",
        sizes={"dev": 4, "val": 4, "test": 4},
        calls=(10, 10),
        target_tokens=1000,
        digest=digest,
        immutable_paths=[],
        case_timeout_s=30,
    )
    run_id = ledger.open_run(terms, task_digest=digest, optimizer="cli-test")
    ledger.close_run(run_id, reason="completed")
    return run_id
