"""One rule for the numbers every command shows, in text and in JSON.

The ledger holds every fractional quantity (a score, a mean, E(H+), E(H0), g, a band, a
case-pass count) as an exact rational. People and programs read them differently:

* **JSON** (``--json``): a quantity named ``q`` is given twice, side by side,
  ``"q": 0.8125`` (a JSON number, the nearest float, to plot and compare) and
  ``"q_exact": "13/16"`` (the exact rational, spelled as the ledger spells it, to
  recompute with). A list of quantities gives two lists (``"scores"`` and
  ``"scores_exact"``). Counts (trials, cases, calls, tokens, K) are JSON integers. A
  share of a limit is ``"percent": 41.7``, a number, never a string with a ``%`` sign.
  Signed documents (events, attestation statements, bundles) are printed as they were
  signed: the rule applies to what a command computes, never to signed bytes.
* **Text**: a quantity to three decimals (``0.812``, ``0.000``, ``-0.125``); a mean with
  the counts it is made of spelled out (``0.812: 117 of 144 trials over 48 cases``); a
  percentage to one decimal (``41.7%``). Rounding is of the exact value, a half to even
  (117/144 = 0.8125 shows as ``0.812``). Where a message says that two exact values
  differ, both are shown exact, since their decimals may be the same.

Commands build their JSON documents with :class:`~fractions.Fraction` values for
quantities; :func:`for_json` (which :func:`holedger.output.emit_json` applies to every
document) turns each into its pair. Sections whose values are already exact strings
(the replay report's) name their quantity keys to :func:`quantities_for_json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

EXACT_SUFFIX = "_exact"
PLACES = 3


def exact(value: object) -> Fraction | None:
    """``value`` as an exact rational (a Fraction, an int, or a string such as "13/16" or
    "0.25"); None when it is None or not a number. Floats and booleans are refused: they
    are never exact quantities here."""
    if value is None or isinstance(value, bool | float):
        return None
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    try:
        return Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        return None


def exact_str(value: Fraction) -> str:
    """The exact rational as the ledger spells it: "2", "0.25", "1/3"."""
    from holedger.schemas.canonical import rational_to_str

    return rational_to_str(value)


def decimal(value: object, places: int = PLACES) -> str:
    """A quantity for people: ``places`` decimals, always (``0.000`` beside ``0.333``);
    ``-`` when there is none; anything that is not a number, as it is."""
    frac = exact(value)
    if frac is None:
        return "-" if value is None else str(value)
    return f"{_round(frac, places):.{places}f}"


def se_text(se: str | None, k: int) -> str:
    """A score's error bar for people (A3), to follow the score: `` ± 0.029 (standard error
    of the 3 round means)``; empty when there is none."""
    if se is None:
        return ""
    return f" ± {decimal(se)} (standard error of the {k} round means)"


def _round(frac: Fraction, places: int) -> float:
    # rounded on the exact value, a half to even (as Python's own rounding does): a float
    # neighbour of the value never decides the last digit
    return float(round(frac, places))


def amount(value: object) -> str:
    """A total that is usually whole (a count of passing trials, case-passes used): the
    integer when it is whole, else up to three decimals without trailing zeros."""
    frac = exact(value)
    if frac is None:
        return "-" if value is None else str(value)
    if frac.denominator == 1:
        return str(frac.numerator)
    return decimal(frac).rstrip("0").rstrip(".")


def percent(part: object, whole: object) -> float | None:
    """``part`` as a percentage of ``whole``, to one decimal; None when whole is 0."""
    p, w = exact(part), exact(whole)
    if p is None or w is None or w == 0:
        return None
    return _round(p * 100 / w, 1)


def percent_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


@dataclass(frozen=True)
class Mean:
    """A mean score and what it is made of: ``total`` score over ``trials`` trials spread
    over ``cases`` cases (each case the same number of trials, so the mean over cases of
    the per-case means is total / trials)."""

    total: Fraction
    trials: int
    cases: int

    @classmethod
    def of(cls, value: Fraction, cases: int, per_case: int) -> Mean:
        """The mean ``value`` of ``cases`` cases, each scored ``per_case`` times."""
        trials = cases * per_case
        return cls(value * trials, trials, cases)

    @property
    def value(self) -> Fraction | None:
        return None if self.trials == 0 else self.total / self.trials

    def text(self) -> str:
        """``0.812: 117 of 144 trials over 48 cases``."""
        if self.trials == 0:
            return "- (no trials)"
        cases = f"{self.cases} case" + ("" if self.cases == 1 else "s")
        trials = f"{self.trials} trial" + ("" if self.trials == 1 else "s")
        return f"{decimal(self.value)}: {amount(self.total)} of {trials} over {cases}"


def pair(key: str, value: object) -> dict[str, Any]:
    """``{key: float, key_exact: "p/q"}`` of one quantity (both None when it has none)."""
    frac = exact(value)
    if frac is None:
        return {key: None, key + EXACT_SUFFIX: None}
    return {key: float(frac), key + EXACT_SUFFIX: exact_str(frac)}


def for_json(data: Any) -> Any:
    """``data`` with every Fraction given as a float and, beside it under ``key_exact``,
    its exact string; a list of Fractions likewise as two lists. Everything else is left
    as it is (a Fraction inside a list of other things becomes its float)."""
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, Fraction) and not isinstance(key, int):
                out.update(pair(str(key), value))
            elif _fraction_list(value):
                out[key] = [float(v) for v in value]
                out[str(key) + EXACT_SUFFIX] = [exact_str(v) for v in value]
            else:
                out[key] = for_json(value)
        return out
    if isinstance(data, list | tuple):
        return [for_json(item) for item in data]
    if isinstance(data, Fraction):
        return float(data)
    return data


def _fraction_list(value: object) -> bool:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(v, Fraction) for v in value)
    )


def quantities_for_json(section: Any, keys: Iterable[str]) -> Any:
    """A section whose quantities are exact strings, with the quantities named in ``keys``
    (at any depth) made Fractions, so that :func:`for_json` gives each its pair. A
    ``percent`` written as "41.7%" becomes the number 41.7."""
    names = set(keys)
    if isinstance(section, Mapping):
        out: dict[str, Any] = {}
        for key, value in section.items():
            if key in names and isinstance(value, str | int) and not isinstance(value, bool):
                frac = exact(value)
                out[key] = value if frac is None else frac
            elif key == "percent" and isinstance(value, str):
                frac = exact(value.removesuffix("%"))
                out[key] = None if frac is None else float(frac)
            elif key in names and isinstance(value, list):
                fracs = [exact(v) for v in value]
                ok = all(f is not None for f in fracs)
                out[key] = fracs if ok else quantities_for_json(value, names)
            else:
                out[key] = quantities_for_json(value, names)
        return out
    if isinstance(section, list):
        return [quantities_for_json(item, names) for item in section]
    return section
