"""A small closed run with task terms, for the command-line tests."""

from __future__ import annotations

from holedger.ledger.store import Ledger


def closed_task_run(ledger: Ledger) -> str:
    """Open and close a run with task terms: three events that replay verifies whole."""
    from fractions import Fraction

    from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget, TaskTerms

    digest = "ab" * 32
    terms = TaskTerms(
        task_id="cli-task",
        models=["sim-small"],
        split_sizes={"dev": 4, "val": 4, "test": 4},
        split_digests={"dev": digest, "val": digest, "test": digest},
        manifest_digest=digest,
        budget=BudgetVector(
            dev=SplitBudget(calls=10, case_passes=Fraction(4)),
            val=SplitBudget(calls=10, case_passes=Fraction(4)),
            target_tokens=1000,
        ),
        disclosure=DisclosurePolicy(),
        k=3,
        resolution_band=Fraction(1, 20),
        verifier_digest=digest,
        seed_commit="0" * 40,
        entrypoint=["python", "-m", "harness"],
        immutable_paths=[],
        case_timeout_s=30,
        environment_digest=digest,
    )
    run_id = ledger.open_run(terms, task_digest=digest, optimizer="cli-test")
    ledger.close_run(run_id, reason="completed")
    return run_id
