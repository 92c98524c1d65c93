"""A run's budget as the optimizer and the operator read it: per component, the limit,
the use so far and what remains.

Components: ``dev calls``, ``dev case_passes``, ``val calls``, ``val case_passes`` (from
the accepted requests), ``target tokens`` (the tokens of the trials' recorded model
calls, against the task's ``target_tokens``) and ``optimizer tokens`` (the optimizer's own
calls through its gateway scope, against the optimizer's cap: the terms'
``optimizer_tokens``, else the gateway's default). Exact rationals are strings, as everywhere in
the API; token counts are integers (the gateway holds the target scope to
``target_tokens`` whatever it is, 0 included). The token counts are those of the recorded
calls: a call in flight holds a reservation the gateway counts, and these do not yet.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.protocol.tokens import optimizer_cap
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import TaskTerms
from holedger.server.state import RunState

TARGET = "target"
OPTIMIZER = "optimizer"


def _number(value: int | Fraction | None) -> Any:
    if value is None or isinstance(value, int):
        return value
    return rational_to_str(value)


def optimizer_token_limit(terms: TaskTerms) -> int:
    """The optimizer scope's token cap: the terms' ``optimizer_tokens``, else the default
    the gateway applies (protocol.tokens)."""
    return optimizer_cap(terms.budget)


def budget_rows(state: RunState, terms: TaskTerms) -> list[dict[str, Any]]:
    """One row per component: ``component``, ``limit``, ``used``, ``remaining``."""
    rows: list[dict[str, Any]] = []
    for split in ("dev", "val"):
        limit = getattr(terms.budget, split)
        used = getattr(state.used, split)
        for name in ("calls", "case_passes"):
            lim, use = getattr(limit, name), getattr(used, name)
            rows.append(
                {
                    "component": f"{split} {name}",
                    "limit": _number(lim),
                    "used": _number(use),
                    "remaining": _number(lim - use),
                }
            )
    target_limit = terms.budget.target_tokens
    target_used = state.tokens.get(TARGET, 0)
    rows.append(
        {
            "component": "target tokens",
            "limit": target_limit,
            "used": target_used,
            "remaining": target_limit - target_used,
        }
    )
    opt_limit = optimizer_token_limit(terms)
    opt_used = state.tokens.get(OPTIMIZER, 0)
    rows.append(
        {
            "component": "optimizer tokens",
            "limit": opt_limit,
            "used": opt_used,
            "remaining": opt_limit - opt_used,
        }
    )
    return rows


def budget_json(state: RunState, terms: TaskTerms) -> dict[str, Any]:
    """The budget as ``GET /v1/runs/RUN`` and ``GET /v1/runs/RUN/budget`` send it:
    ``components`` (the rows) and ``limit``, ``used`` and ``remaining`` as nested objects
    (``{"dev": {"calls", "case_passes"}, "val": {...}, "target_tokens",
    "optimizer_tokens"}``)."""
    rows = budget_rows(state, terms)
    nested: dict[str, dict[str, Any]] = {"limit": {}, "used": {}, "remaining": {}}
    for row in rows:
        first, _, second = str(row["component"]).partition(" ")
        for key in nested:
            if first in ("dev", "val"):
                nested[key].setdefault(first, {})[second] = row[key]
            else:
                nested[key][f"{first}_{second}"] = row[key]
    return {"components": rows, **nested}
