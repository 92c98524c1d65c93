"""Task terms for tests that write runs by hand: one builder, each test naming only what
matters to it (split sizes, budget limits, k, the seed commit...)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget, TaskTerms


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def task_terms(
    task_id: str = "demo-task",
    *,
    sizes: Mapping[str, int] | None = None,
    calls: tuple[int, int] = (100, 100),
    case_passes: tuple[Fraction | int | str, Fraction | int | str] = (4, 4),
    target_tokens: int = 1_000_000,
    per_trial_tokens: int | None = None,
    digest: str | None = None,
    **changes: Any,
) -> TaskTerms:
    """Valid terms for ``task_id``. ``calls`` and ``case_passes`` are the (dev, val) search
    limits; ``digest``, when given, stands for every digest (else each is the SHA-256 of
    its name); ``changes`` sets any other field of :class:`TaskTerms`."""
    sizes = dict(sizes or {"dev": 10, "val": 10, "test": 10})

    def d(name: str) -> str:
        return digest if digest is not None else sha(name)

    fields: dict[str, Any] = {
        "task_id": task_id,
        "models": ["sim-small"],
        "split_sizes": sizes,
        "split_digests": {split: d(split) for split in sizes},
        "manifest_digest": d("manifest"),
        "budget": BudgetVector(
            dev=SplitBudget(calls=calls[0], case_passes=Fraction(case_passes[0])),
            val=SplitBudget(calls=calls[1], case_passes=Fraction(case_passes[1])),
            target_tokens=target_tokens,
            per_trial_tokens=per_trial_tokens,
        ),
        "disclosure": DisclosurePolicy(),
        "k": 3,
        "resolution_band": Fraction(1, 20),
        "verifier_digest": d("verifier"),
        "seed_commit": "0" * 40,
        "entrypoint": ["python", "-m", "harness"],
        "immutable_paths": ["verifier/"],
        "case_timeout_s": 60,
        "environment_digest": d("env"),
    }
    unknown = set(changes) - set(TaskTerms.model_fields)
    if unknown:
        raise TypeError(f"TaskTerms has no field(s) {sorted(unknown)}")
    return TaskTerms(**(fields | changes))
