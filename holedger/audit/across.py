"""HDA across audits (B4 'across settings'): mean shares, the settings where detected
overfitting and scaling explain more than half the gain, and the dominant term per task.

One setting is one decomposed audit; a run audited several times counts once per audit
(a reading, not stated: the audits are listed, so a reader can see repeats). Audits that
are not decomposed (not significant, or waiting for a neutralized commit) are listed and
left out of the means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from holedger.schemas.canonical import rational_to_str

TERMS = ("o", "t", "g")


@dataclass(frozen=True)
class Setting:
    audit_id: str
    run_id: str
    task: str
    status: str
    delta: Fraction | None
    shares: tuple[Fraction, Fraction, Fraction] | None
    held_out_delta: Fraction | None = None  # B5: E(H+) - E(H0) of the run
    val_selection: dict[str, Any] | None = None  # B5: the val-selected candidate's


def summarize(settings: Sequence[Setting]) -> dict[str, Any]:
    decomposed = [s for s in settings if s.shares is not None]
    n = len(decomposed)
    means = (
        {
            term: rational_to_str(
                sum((s.shares[i] for s in decomposed if s.shares), Fraction(0)) / n
            )
            for i, term in enumerate(TERMS)
        }
        if n
        else None
    )
    over_half = [
        s.audit_id for s in decomposed if s.shares and s.shares[0] + s.shares[1] > Fraction(1, 2)
    ]
    per_task: dict[str, list[Setting]] = {}
    for s in decomposed:
        per_task.setdefault(s.task, []).append(s)
    dominant = {}
    for task, group in sorted(per_task.items()):
        sums = [sum((s.shares[i] for s in group if s.shares), Fraction(0)) for i in range(3)]
        best = max(sums)
        dominant[task] = {
            "term": "/".join(TERMS[i].upper() for i in range(3) if sums[i] == best),
            "settings": len(group),
            "mean_shares": {TERMS[i]: rational_to_str(sums[i] / len(group)) for i in range(3)},
        }
    transferred = [s for s in decomposed if s.held_out_delta is not None and s.delta is not None]

    def count(below: Any) -> dict[str, Any]:
        hits = [s.audit_id for s in transferred if below(s.held_out_delta, s.delta)]
        return {"count": len(hits), "audits": hits}

    chosen = [s for s in decomposed if s.val_selection is not None]

    def flagged(flag: str) -> dict[str, Any]:
        hits = [s.audit_id for s in chosen if s.val_selection and s.val_selection[flag]]
        return {"count": len(hits), "audits": hits}

    def mean_of(key: str) -> str | None:
        values = [Fraction(s.val_selection[key]) for s in chosen if s.val_selection]
        return rational_to_str(sum(values, Fraction(0)) / len(values)) if values else None

    return {
        "val_selection": {  # B5: selecting by val instead of by search
            "settings": len(chosen),
            "mean_held_out_search_selected": mean_of("held_out_search_selected"),
            "mean_held_out_val_selected": mean_of("held_out_val_selected"),
            "improves": flagged("improves"),
            "worsens": flagged("worsens"),
            "still_below_search_gain": flagged("val_below_search_gain"),
        },
        "transfer": {  # B5 across settings: the held-out gain against the search gain
            "settings": len(transferred),
            "below_search": count(lambda held, search: held < search),
            "below_half_search": count(lambda held, search: held < search / 2),
            "below_zero": count(lambda held, search: held < 0),
        },
        "settings": [
            {
                "audit_id": s.audit_id,
                "run_id": s.run_id,
                "task": s.task,
                "status": s.status,
                "delta": None if s.delta is None else rational_to_str(s.delta),
                "shares": None
                if s.shares is None
                else {t: rational_to_str(v) for t, v in zip(TERMS, s.shares, strict=True)},
            }
            for s in settings
        ],
        "decomposed": n,
        "mean_shares": means,
        "o_plus_t_over_half": {"count": len(over_half), "audits": over_half},
        "dominant_term_per_task": dominant,
        "notes": [
            "O is a lower bound (only detected, removed overfitting); G an upper bound, "
            "not evidence of transfer",
            "one setting per decomposed audit (reading, not stated)",
        ],
    }


def setting_of(state: Any, task: str) -> Setting:
    """A decomposed (or not) audit as one setting."""
    d = state.decomposed
    decomposition = d.decomposition if d is not None else None
    shares = None
    delta = None
    if decomposition is not None:
        delta = Fraction(decomposition["delta"])
        raw = decomposition.get("shares")
        if raw:
            shares = (Fraction(raw["o"]), Fraction(raw["t"]), Fraction(raw["g"]))
    status = d.status if d is not None else ("opened" if state.gate is None else "running")
    transfer = d.transfer if d is not None else None
    held = Fraction(transfer["held_out_delta"]) if transfer else None
    chosen = transfer.get("val_selection") if transfer else None
    return Setting(state.audit_id, state.opened.run_id, task, status, delta, shares, held, chosen)
