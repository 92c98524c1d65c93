"""The protocol's pure rules: cost, budget gate, request validity, disclosure, gain.

Every function here is pure (no I/O, no clock, no randomness). The server calls them to
*decide* and replay calls the same functions on the recorded events to *check* each
decision, so a recorded decision is right exactly when re-running the rule on what the
log says gives the same answer.

Definitions (HarnessOpt-Bench):

* cost of a request: ``calls = 1`` and ``case_passes = |Q| * attempts / |split|``, an
  exact rational (one case-pass is one evaluation of every case of the split once);
* budget use: per search split (dev, val) the sums of calls and case-passes of every
  *accepted* request; test-split scoring is not charged to the search budget;
* disclosure: dev ``per_case`` (per case: scores, answers, trace digests), val
  ``aggregate`` (case count, trial count, mean only), test ``none`` (never projected);
  a dev answer is shown in the body only while it is small (:data:`MAX_SHOWN_ANSWER_BYTES`
  each, :data:`MAX_SHOWN_ANSWERS_BYTES` in one projection, in case-id then attempt
  order); a larger one is shown by its digest alone (``answer_in_blob``), and the
  optimizer fetches the blob, so one projection stays small whatever the harness prints;
* E(H+) = mean over cases of the mean over the K attempts of that case;
* g = (E(H+) - E(H0)) / (1 - E(H0)), undefined (None) when E(H0) = 1.

Recording conventions that replay (holedger/replay/) checks:

* requests are decided in log order: ``budget_before`` is the use folded from every
  accepted request before it, a rejection's ``code`` is the rule's refusal code
  (:mod:`holedger.protocol.refusals`; ``reason`` is its text, for people);
* a request's trials are its case ids x attempts, attempts numbered ``0..attempts-1``,
  all recorded before its one DisclosureProjected (none for the test split);
* the answer blob (``answer_digest``) holds :func:`answer_bytes` of the parsed answer;
* held-out scoring comes after CandidateNominated: the nominated candidate's trials on
  every test case, attempts ``0..K-1``, either under an accepted EvaluationRequested on
  the test split (``request_problem`` with ``nominated=True``; not charged) or with a
  request id of their own; then RunScored.
"""

from __future__ import annotations

import decimal
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from holedger.errors import PolicyError
from holedger.protocol.answers import answer_bytes, answer_digest
from holedger.protocol.refusals import (
    BAD_ATTEMPTS,
    BUDGET_CALLS,
    BUDGET_CASE_PASSES,
    HELDOUT_ATTEMPTS,
    NO_CASES,
    REPEATED_CASE,
    TEST_SEALED,
    UNKNOWN_CASE,
    UNKNOWN_SPLIT,
    VAL_TOO_FEW_CASES,
    Refusal,
)
from holedger.schemas.canonical import canonical_json, rational_to_str
from holedger.schemas.events import (
    BudgetUse,
    BudgetVector,
    CaseCost,
    DisclosurePolicy,
    RoundError,
    SplitUse,
    TaskTerms,
    TrialCompleted,
)

SEARCH_SPLITS = ("dev", "val")
# The optimizer label of a task's seed-baseline run (the run whose E(H+) is the E(H0)
# every later run of the task pins).
BASELINE_OPTIMIZER = "seed-baseline"
# The optimizer label of a re-scoring run (RunOpened.rescore_of): the trusted server scores
# a closed run's nominee again on the test split; no search, no optimizer.
RESCORE_OPTIMIZER = "rescore"

# A dev answer whose canonical JSON is longer than this is shown by digest, not inline.
MAX_SHOWN_ANSWER_BYTES = 64 << 10
# The answers shown inline in one projection, in all (canonical JSON bytes).
MAX_SHOWN_ANSWERS_BYTES = 4 << 20


# --------------------------------------------------------------------------- cost and budget


def request_cost(split_size: int, n_cases: int, attempts: int) -> CaseCost:
    """The cost vector of one request: 1 call and ``n_cases * attempts / split_size``."""
    if split_size < 1:
        raise PolicyError(f"split size {split_size} is not positive")
    return CaseCost(calls=1, case_passes=Fraction(n_cases * attempts, split_size))


def no_use() -> BudgetUse:
    """Budget use before the first request."""
    zero = SplitUse(calls=0, case_passes=Fraction(0))
    return BudgetUse(dev=zero, val=zero)


def add_use(used: BudgetUse, split: str, cost: CaseCost) -> BudgetUse:
    """``used`` plus an accepted request's ``cost`` on ``split`` (test is not charged)."""
    if split not in SEARCH_SPLITS:
        return used
    before: SplitUse = getattr(used, split)
    after = SplitUse(
        calls=before.calls + cost.calls, case_passes=before.case_passes + cost.case_passes
    )
    return used.model_copy(update={split: after})


def budget_decision(
    budget: BudgetVector, used: BudgetUse, split: str, cost: CaseCost
) -> Refusal | None:
    """None when every budget component of ``split`` still fits after adding ``cost``.

    Otherwise the refusal, naming the first component that would be overspent.
    """
    if split not in SEARCH_SPLITS:
        return None
    limit = getattr(budget, split)
    spent: SplitUse = getattr(used, split)
    if spent.calls + cost.calls > limit.calls:
        return Refusal(
            BUDGET_CALLS,
            f"{split} calls budget exceeded: {spent.calls} used + {cost.calls} "
            f"> limit {limit.calls}",
        )
    if spent.case_passes + cost.case_passes > limit.case_passes:
        return Refusal(
            BUDGET_CASE_PASSES,
            f"{split} case_passes budget exceeded: {rational_to_str(spent.case_passes)} used + "
            f"{rational_to_str(cost.case_passes)} > limit {rational_to_str(limit.case_passes)}",
        )
    return None


def request_problem(
    terms: TaskTerms,
    split: str,
    case_ids: list[str],
    attempts: int,
    *,
    nominated: bool,
    known_cases: set[str] | None,
) -> Refusal | None:
    """Why a request is invalid regardless of budget, or None when it is well-formed.

    The test split is only evaluated after nomination, K attempts per case (held-out
    scoring); val requests need at least ``min_aggregate_cases`` distinct cases so an
    aggregate cannot be narrowed to one case; ``known_cases`` (the split's case ids, when
    the caller knows them) rejects unknown ids.
    """
    if split not in ("dev", "val", "test"):
        return Refusal(UNKNOWN_SPLIT, f"unknown split {split!r}")
    if attempts < 1:
        return Refusal(BAD_ATTEMPTS, f"attempts must be at least 1, got {attempts}")
    if not case_ids:
        return Refusal(NO_CASES, "no cases requested")
    repeated = sorted(c for c, n in Counter(case_ids).items() if n > 1)
    if repeated:
        return Refusal(REPEATED_CASE, f"case {repeated[0]} requested more than once")
    if split == "test":
        if not nominated:
            return Refusal(TEST_SEALED, "the test split is closed until a candidate is nominated")
        if attempts != terms.k:
            return Refusal(
                HELDOUT_ATTEMPTS, f"held-out scoring uses K={terms.k} attempts, not {attempts}"
            )
    if known_cases is not None:
        unknown = sorted(set(case_ids) - known_cases)
        if unknown:
            return Refusal(UNKNOWN_CASE, f"case {unknown[0]} is not in the {split} split")
    if split == "val" and len(case_ids) < terms.disclosure.min_aggregate_cases:
        return Refusal(
            VAL_TOO_FEW_CASES,
            f"val requests need at least {terms.disclosure.min_aggregate_cases} cases "
            f"(aggregate disclosure), got {len(case_ids)}",
        )
    return None


# --------------------------------------------------------------------------- disclosure


@dataclass(frozen=True)
class TrialView:
    """What disclosure may draw from one trial.

    ``answer`` is the harness's parsed JSON answer: the blob named by ``answer_digest``
    holds its canonical JSON bytes (:func:`answer_bytes`). ``answer_known`` is False when
    the answer exists (it has a digest) but its bytes are not at hand (replay of a bundle
    whose answer blob is redacted and whose projection did not show it): such an answer
    is shown by digest, which is never more than the rules allow.
    """

    case_id: str
    attempt: int
    score: Fraction
    answer: Any | None = None
    answer_digest: str | None = None
    trace_digest: str | None = None
    exit_status: int | None = None
    timed_out: bool = False
    answer_known: bool = True


def trial_view(
    trial: TrialCompleted, answer: Any | None = None, *, answer_known: bool = True
) -> TrialView:
    """The TrialView of a recorded trial (the trace digest is the trial's trace_digest)."""
    return TrialView(
        case_id=trial.case_id,
        attempt=trial.attempt,
        score=trial.score,
        answer=answer,
        answer_digest=trial.answer_digest,
        trace_digest=trial.trace_digest,
        exit_status=trial.exit_status,
        timed_out=trial.timed_out,
        answer_known=answer_known,
    )


def _by_case(trials: Iterable[TrialView]) -> dict[str, list[TrialView]]:
    cases: dict[str, list[TrialView]] = {}
    for trial in trials:
        cases.setdefault(trial.case_id, []).append(trial)
    for views in cases.values():
        views.sort(key=lambda t: t.attempt)
    return cases


def project(
    split: str, policy: DisclosurePolicy, trials: Sequence[TrialView]
) -> tuple[str, dict[str, Any]]:
    """The disclosure projection of one request's trials: ``(policy name, body)``.

    dev: ``("per_case", {"cases": {id: {"mean", "trials": [...]}}, "trials": t})``, each
    trial with attempt, score, answer, answer_digest, trace_digest, exit_status,
    timed_out; an answer too large to show inline (see :func:`shown_inline`) is ``null``
    with ``"answer_in_blob": true`` beside it.
    val: ``("aggregate", {"cases": n, "trials": t, "mean": "<rational>"})`` with mean =
    mean over cases of each case's mean score; refused below ``min_aggregate_cases``
    cases. test: refused (never projected).
    """
    if not trials:
        raise PolicyError("no trials to project")
    cases = _by_case(trials)
    if split == "dev":
        inline = shown_inline(trials)
        body: dict[str, Any] = {
            "cases": {
                case_id: {
                    "mean": rational_to_str(mean([t.score for t in views])),
                    "trials": [_trial_body(t, (t.case_id, t.attempt) in inline) for t in views],
                }
                for case_id, views in cases.items()
            },
            "trials": len(trials),
        }
        return policy.dev, body
    if split == "val":
        if len(cases) < policy.min_aggregate_cases:
            raise PolicyError(
                f"val aggregate over {len(cases)} cases is below the minimum "
                f"{policy.min_aggregate_cases}"
            )
        overall = mean([mean([t.score for t in views]) for views in cases.values()])
        return policy.val, {
            "cases": len(cases),
            "trials": len(trials),
            "mean": rational_to_str(overall),
        }
    raise PolicyError(f"the {split} split is never disclosed")


def shown_inline(trials: Iterable[TrialView]) -> set[tuple[str, int]]:
    """The ``(case id, attempt)`` of the trials whose answer a dev projection shows inline.

    In case-id then attempt order, an answer is shown while its canonical JSON is at most
    :data:`MAX_SHOWN_ANSWER_BYTES` and, with the answers shown before it, at most
    :data:`MAX_SHOWN_ANSWERS_BYTES`; a trial without an answer shows ``null`` (0 bytes).
    An answer whose bytes are unknown (``answer_known`` False) is not shown. The order
    depends only on the trials, so the server and replay draw the same line.
    """
    left = MAX_SHOWN_ANSWERS_BYTES
    inline: set[tuple[str, int]] = set()
    for trial in sorted(trials, key=lambda t: (t.case_id, t.attempt)):
        key = (trial.case_id, trial.attempt)
        if trial.answer_digest is None:
            inline.add(key)
            continue
        if not trial.answer_known:
            continue
        size = len(answer_bytes(trial.answer))
        if size <= MAX_SHOWN_ANSWER_BYTES and size <= left:
            left -= size
            inline.add(key)
    return inline


def _trial_body(trial: TrialView, inline: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "attempt": trial.attempt,
        "score": rational_to_str(trial.score),
        "answer": trial.answer if inline else None,
        "answer_digest": trial.answer_digest,
        "trace_digest": trial.trace_digest,
        "exit_status": trial.exit_status,
        "timed_out": trial.timed_out,
    }
    if not inline:
        body["answer_in_blob"] = True
    return body


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def fetchable_digests(body: object) -> set[str]:
    """The blobs a projection body opens to its optimizer: the trials' ``answer_digest``
    and ``trace_digest`` fields, never a digest-shaped string inside an answer."""
    return set(fetchable_roles(body))


def fetchable_roles(body: object) -> dict[str, str]:
    """:func:`fetchable_digests` with the role of each blob: ``answer`` (a trial's
    ``answer_digest``) or ``trace`` (its ``trace_digest``); answer wins a digest named
    as both."""
    found: dict[str, str] = {}
    cases = body.get("cases") if isinstance(body, dict) else None
    if not isinstance(cases, dict):
        return found
    for entry in cases.values():
        trials = entry.get("trials") if isinstance(entry, dict) else None
        for trial in trials if isinstance(trials, list) else []:
            if not isinstance(trial, dict):
                continue
            for name, role in (("trace_digest", "trace"), ("answer_digest", "answer")):
                value = trial.get(name)
                if isinstance(value, str) and _DIGEST.match(value):
                    found[value] = role
    return found


def projection_digest(projection: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the projection body's canonical JSON."""
    return hashlib.sha256(canonical_json(dict(projection))).hexdigest()


# --------------------------------------------------------------------------- scores


def mean(values: Sequence[Fraction]) -> Fraction:
    """The exact arithmetic mean; ValueError on an empty sequence."""
    if not values:
        raise ValueError("mean of no values")
    return Fraction(sum(values, Fraction(0))) / len(values)


def expected_score(per_case: Mapping[str, Sequence[Fraction]]) -> Fraction:
    """E(H): the mean over cases of the mean over that case's attempts."""
    return mean([mean(list(scores)) for scores in per_case.values()])


def per_case_digest(per_case: Iterable[tuple[str, Sequence[Fraction]]]) -> str:
    """The digest a pinned seed baseline names its baseline run's per-case scores by: the
    SHA-256 of the canonical JSON ``[{"case_id": ..., "scores": ["<rational>", ...]}, ...]``
    in the order given (that of ``RunScored.per_case``)."""
    body = [
        {"case_id": c, "scores": [rational_to_str(s) for s in scores]} for c, scores in per_case
    ]
    return hashlib.sha256(canonical_json(body)).hexdigest()


def round_means(per_case: Sequence[Sequence[Fraction]]) -> list[Fraction]:
    """The K round means of a K-attempt scoring (round r = attempt r of every case); []
    when there are no cases or the cases were scored a different number of times."""
    if not per_case or len({len(s) for s in per_case}) != 1:
        return []
    return [mean([scores[r] for scores in per_case]) for r in range(len(per_case[0]))]


def round_se(rounds: Sequence[Fraction]) -> str | None:
    """The standard error of the round means, sd(n - 1) / sqrt(K) (A3), as a decimal
    rounded half-even to 9 places, computed exactly (a decimal square root of the exact
    variance / K at 40 digits); None for fewer than two rounds."""
    k = len(rounds)
    if k < 2:
        return None
    centre = mean(list(rounds))
    square = sum(((r - centre) ** 2 for r in rounds), Fraction(0)) / (k - 1) / k
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        root = (decimal.Decimal(square.numerator) / decimal.Decimal(square.denominator)).sqrt()
        rounded = root.quantize(decimal.Decimal("1e-9"), rounding=decimal.ROUND_HALF_EVEN)
        return format(rounded, "f")


def round_error(per_case: Iterable[Sequence[Fraction]]) -> RoundError | None:
    """A K-attempt scoring's error bar (A3): its round means and their standard error
    (:func:`round_se`); None when it has no cases or cases scored unequally often."""
    rounds = round_means(list(per_case))
    if not rounds:
        return None
    return RoundError(round_means=rounds, se=round_se(rounds))


TIMEOUT_SCORES = ("zero", "verifier")


def trial_score(
    verifier_score: Fraction, *, timed_out: bool, timeout_score: str | None
) -> Fraction:
    """A trial's score under the task's timeout rule: a trial killed at its time limit
    scores 0 (``zero``, the default), unless the terms say its answer is scored as any
    other (``verifier``); ``None`` is a log's terms written before the rule existed."""
    if timed_out and (timeout_score or "zero") == "zero":
        return Fraction(0)
    return verifier_score


def normalized_gain(e_plus: Fraction, e0: Fraction) -> Fraction | None:
    """g = (E(H+) - E(H0)) / (1 - E(H0)); None when E(H0) = 1 (no headroom)."""
    if e0 == 1:
        return None
    return (e_plus - e0) / (1 - e0)


# A5's three outcomes of a gain against the task's resolution band b (two-sided; the
# inequality is strict: reading, not stated).
RESOLVED_GAIN = "resolved gain"  # g > b
INDISTINGUISHABLE = "indistinguishable from 0"  # |g| <= b
RESOLVED_LOSS = "resolved loss"  # g < -b


def band_outcome(g: Fraction | None, band: Fraction | None) -> str | None:
    """Which of A5's outcomes ``g`` has against ``band``: resolved (|g| > b) as a gain or a
    loss, else indistinguishable from 0 (|g| <= b); None when g or the band is unknown."""
    if g is None or band is None:
        return None
    if abs(g) <= band:
        return INDISTINGUISHABLE
    return RESOLVED_GAIN if g > 0 else RESOLVED_LOSS


def band_outcome_text(outcome: str | None, band: str) -> str:
    """How replay, the report and the demo say an outcome (``band`` already formatted)."""
    if outcome is None:
        return f"g undefined; resolution band {band}"
    rule = "|g| <= b" if outcome == INDISTINGUISHABLE else "|g| > b"
    return f"{outcome}: {rule}, resolution band {band}"


__all__ = [
    "BASELINE_OPTIMIZER",
    "INDISTINGUISHABLE",
    "MAX_SHOWN_ANSWERS_BYTES",
    "MAX_SHOWN_ANSWER_BYTES",
    "RESCORE_OPTIMIZER",
    "RESOLVED_GAIN",
    "RESOLVED_LOSS",
    "TrialView",
    "add_use",
    "answer_bytes",
    "answer_digest",
    "band_outcome",
    "band_outcome_text",
    "budget_decision",
    "expected_score",
    "fetchable_digests",
    "fetchable_roles",
    "mean",
    "no_use",
    "normalized_gain",
    "per_case_digest",
    "project",
    "projection_digest",
    "request_cost",
    "request_problem",
    "round_error",
    "round_means",
    "round_se",
    "shown_inline",
    "trial_score",
    "trial_view",
]
