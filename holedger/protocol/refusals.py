"""Refusals as typed values: a stable code beside the text a person reads.

The writer records both (``EvaluationRequested.code`` and ``reason``); replay compares
the code the rules give with the recorded one, never the text, so rewording a message
changes no verdict. Codes are part of the log format: never rename one.

Logs written before requests carried a code hold the text alone. :func:`legacy_code`
reads the code off that text by the wording those logs used, which is frozen here and
independent of today's messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# A request over its search budget, by the component that would be overspent.
BUDGET_CALLS: Final = "budget.calls"
BUDGET_CASE_PASSES: Final = "budget.case_passes"
# A request that no budget could make valid.
UNKNOWN_SPLIT: Final = "protocol.unknown_split"
BAD_ATTEMPTS: Final = "protocol.attempts"
NO_CASES: Final = "protocol.no_cases"
REPEATED_CASE: Final = "protocol.repeated_case"
TEST_SEALED: Final = "protocol.test_sealed"
HELDOUT_ATTEMPTS: Final = "protocol.heldout_attempts"
UNKNOWN_CASE: Final = "protocol.unknown_case"
VAL_TOO_FEW_CASES: Final = "protocol.val_min_cases"
# A solve-evolve step asked for out of its turn: the next batch while the evolver still
# owes the last one its commit or "unchanged", or a commit or "unchanged" for a step that
# is not the one awaiting it (holedger/protocol/evolve.py).
EVOLVE_OUT_OF_TURN: Final = "evolve.out_of_turn"
EVOLVE_DONE: Final = "evolve.done"  # every step of the stream has closed
EVOLVE_OUT_OF_SCOPE: Final = "evolve.out_of_scope"  # a changed path outside the scope
EVOLVE_WRONG_PARENT: Final = "evolve.wrong_parent"  # a parent other than H_{t-1}
EVOLVE_STEP_BUDGET: Final = "evolve.step_budget"  # the step's evolver tokens overspent
EVOLVE_NOT_SOLVE_EVOLVE: Final = "evolve.not_solve_evolve"  # a search run, or the reverse

CODES: Final = frozenset(
    {
        BUDGET_CALLS,
        BUDGET_CASE_PASSES,
        UNKNOWN_SPLIT,
        BAD_ATTEMPTS,
        NO_CASES,
        REPEATED_CASE,
        TEST_SEALED,
        HELDOUT_ATTEMPTS,
        UNKNOWN_CASE,
        VAL_TOO_FEW_CASES,
        EVOLVE_OUT_OF_TURN,
        EVOLVE_DONE,
        EVOLVE_OUT_OF_SCOPE,
        EVOLVE_WRONG_PARENT,
        EVOLVE_STEP_BUDGET,
        EVOLVE_NOT_SOLVE_EVOLVE,
    }
)


@dataclass(frozen=True)
class Refusal:
    """Why a rule refuses: ``code`` (one of :data:`CODES`) and ``text`` for people."""

    code: str
    text: str

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown refusal code {self.code!r}")

    @property
    def over_budget(self) -> bool:
        """True for a refusal of the budget (the request was well-formed)."""
        return self.code.startswith("budget.")

    def __str__(self) -> str:
        return self.text


# The wording of each refusal in logs written before codes were recorded (the first
# pattern found in the recorded reason).
_LEGACY: Final = (
    (re.compile(r"(?:dev|val) calls budget exceeded: "), BUDGET_CALLS),
    (re.compile(r"(?:dev|val) case_passes budget exceeded: "), BUDGET_CASE_PASSES),
    (re.compile(r"unknown split "), UNKNOWN_SPLIT),
    (re.compile(r"attempts must be at least 1, got "), BAD_ATTEMPTS),
    (re.compile(r"no cases requested"), NO_CASES),
    (re.compile(r"case .* requested more than once"), REPEATED_CASE),
    (re.compile(r"the test split is closed until a candidate is nominated"), TEST_SEALED),
    (re.compile(r"held-out scoring uses K=\d+ attempts, not "), HELDOUT_ATTEMPTS),
    (re.compile(r"case .* is not in the (?:dev|val|test) split"), UNKNOWN_CASE),
    (
        re.compile(r"val requests need at least \d+ cases \(aggregate disclosure\), got "),
        VAL_TOO_FEW_CASES,
    ),
)


def legacy_code(reason: str | None) -> str | None:
    """The code of a refusal recorded as text alone (a log from before codes), or None."""
    if not reason:
        return None
    for pattern, code in _LEGACY:
        if pattern.search(reason):
            return code
    return None
