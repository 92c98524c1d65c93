"""The solve-evolve rules (protocol/evolve.py): opening terms, the step fold, refusals."""

from __future__ import annotations

from fractions import Fraction

import pytest

from holedger.protocol import evolve, refusals
from holedger.schemas.events import (
    BudgetUse,
    CandidateCommitted,
    CaseCost,
    CaseScores,
    DisclosureProjected,
    EvaluationRequested,
    EvolveTerms,
    GatewayCall,
    InSituScored,
    SplitUse,
    StepClosed,
    TokenUsage,
    TrialCompleted,
)

SEED, H1 = "a" * 40, "b" * 40
STREAM = ["c1", "c2", "c3", "c4"]
SEED_PATHS = ["harness/__main__.py", "harness/prompts/p.txt", "corpus/a.txt"]
DIGEST = "d" * 64


def terms(step_tokens: int | None = None) -> EvolveTerms:
    return EvolveTerms(
        stream=STREAM,
        stream_digest=evolve.stream_digest("dev", STREAM),
        batch=2,
        steps=2,
        scope=["harness/prompts/"],
        step_tokens=step_tokens,
    )


@pytest.mark.parametrize(
    ("stream", "batch", "steps", "scope", "words"),
    [
        (STREAM, 5, 1, ["harness/"], "larger than the stream of 4"),
        (STREAM, 2, 0, ["harness/"], "--steps must be at least 1"),
        (STREAM, 2, 3, ["harness/"], "3 steps of 2 cases need 6"),
        (STREAM, 2, 2, ["tools/"], "names no folder of the seed"),
        (STREAM, 2, 2, ["corpus/"], "overlaps the task's immutable path"),
        (STREAM, 2, 2, ["../x"], "is not a folder path"),
        (["c1", "c2", "c1"], 1, 1, ["harness/"], "repeats case 'c1'"),
    ],
)
def test_bad_terms_are_named(
    stream: list[str], batch: int, steps: int, scope: list[str], words: str
) -> None:
    problem = evolve.open_problem(stream, batch, steps, scope, SEED_PATHS, ["corpus/"])
    assert problem is not None
    assert words in problem[0]


def test_good_terms_pass_and_batches_follow_the_stream() -> None:
    assert evolve.open_problem(STREAM, 2, 2, ["harness"], SEED_PATHS, ["corpus/"]) is None
    t = terms()
    assert evolve.batch_of(t, 1) == ["c1", "c2"]
    assert evolve.batch_of(t, 2) == ["c3", "c4"]
    assert evolve.in_scope("harness/prompts/p.txt", t.scope)
    assert not evolve.in_scope("harness/__main__.py", t.scope)
    # the digest names split and order: a reordered stream is another stream
    assert evolve.stream_digest("dev", STREAM) != evolve.stream_digest("dev", STREAM[::-1])


def _request(step: int, candidate: str, cases: list[str]) -> EvaluationRequested:
    zero = SplitUse(calls=0, case_passes=Fraction(0))
    return EvaluationRequested(
        request_id=f"step-{step:04d}",
        candidate=candidate,
        split="dev",
        case_ids=cases,
        attempts=1,
        cost=CaseCost(calls=1, case_passes=Fraction(len(cases), 10)),
        budget_before=BudgetUse(dev=zero, val=zero),
        decision="accepted",
    )


def _trial(step: int, candidate: str, case: str, score: int) -> TrialCompleted:
    return TrialCompleted(
        request_id=f"step-{step:04d}",
        trial_id=f"step-{step:04d}-{case}",
        candidate=candidate,
        split="dev",
        case_id=case,
        attempt=0,
        backend="process",
        isolation="none",
        limits={},
        exit_status=0,
        timed_out=False,
        oom=False,
        wall_ms=1,
        answer_digest=None,
        output_digest=None,
        trace_digest=None,
        score=Fraction(score),
        tokens=TokenUsage(),
        gateway_calls=0,
    )


def _projected(step: int) -> DisclosureProjected:
    return DisclosureProjected(
        request_id=f"step-{step:04d}",
        split="dev",
        policy="per_case",
        projection={},
        projection_digest=DIGEST,
    )


def _call(total: int) -> GatewayCall:
    return GatewayCall(
        call_id="c",
        scope="optimizer",
        model_requested="m",
        model_served="m",
        allowed=True,
        status=200,
        tokens=TokenUsage(total=total),
        reserved=0,
        latency_ms=1,
        request_digest=None,
        response_digest=None,
    )


def _closed(step: int, outcome: str, parent: str, cand: str, tokens: int = 0) -> StepClosed:
    return StepClosed(
        step=step,
        outcome=outcome,  # type: ignore[arg-type]
        parent=parent,
        candidate=cand,
        request_id=f"step-{step:04d}",
        projection_digest=DIGEST,
        evolver_tokens=tokens,
    )


def test_an_honest_run_folds_without_problems_and_j_is_worked_by_hand() -> None:
    log = evolve.EvolveLog(terms(step_tokens=100), SEED)
    events = [
        _request(1, SEED, ["c1", "c2"]),
        _trial(1, SEED, "c1", 1),
        _trial(1, SEED, "c2", 0),
        _projected(1),
        _call(60),
        CandidateCommitted(
            candidate=H1,
            index=1,
            tree="t",
            parent=SEED,
            changed_paths=["harness/prompts/p.txt"],
            immutable_ok=True,
        ),
        _closed(1, "committed", SEED, H1, tokens=60),
        _request(2, H1, ["c3", "c4"]),
        _trial(2, H1, "c3", 1),
        _trial(2, H1, "c4", 1),
        _projected(2),
        _closed(2, "unchanged", H1, H1),
    ]
    for event in events:
        assert log.apply(event) == [], event
        if isinstance(event, DisclosureProjected):
            assert evolve.solve_refusal(log) is not None  # out of turn until it closes
    assert log.phase == "done"
    # 3 of 4 cases pass: J = 3/4, Base 1/2 -> delta 1/4
    scored = InSituScored(
        per_case=[
            CaseScores(case_id=c, scores=[Fraction(s)])
            for c, s in zip(STREAM, [1, 0, 1, 1], strict=True)
        ],
        j=Fraction(3, 4),
        base=Fraction(1, 2),
        delta=Fraction(1, 4),
    )
    assert log.apply(scored) == []
    wrong = scored.model_copy(update={"j": Fraction(1, 2)})
    log2 = evolve.EvolveLog(terms(step_tokens=100), SEED)
    for event in events:
        log2.apply(event)
    assert [p.kind for p in log2.apply(wrong)] == ["score"]


def test_refusals_out_of_turn_scope_parent_and_budget() -> None:
    log = evolve.EvolveLog(terms(step_tokens=50), SEED)
    assert evolve.close_refusal(log, 1, SEED, []).code == refusals.EVOLVE_OUT_OF_TURN  # type: ignore[union-attr]
    assert evolve.solve_refusal(log) is None
    for event in (_request(1, SEED, ["c1", "c2"]), _trial(1, SEED, "c1", 1)):
        log.apply(event)
    assert evolve.solve_refusal(log).code == refusals.EVOLVE_OUT_OF_TURN  # type: ignore[union-attr]
    log.apply(_trial(1, SEED, "c2", 1))
    log.apply(_projected(1))
    inside = ["harness/prompts/p.txt"]
    assert evolve.close_refusal(log, 1, H1, inside).code == refusals.EVOLVE_WRONG_PARENT  # type: ignore[union-attr]
    outside = ["harness/__main__.py"]
    assert evolve.close_refusal(log, 1, SEED, outside).code == refusals.EVOLVE_OUT_OF_SCOPE  # type: ignore[union-attr]
    assert evolve.close_refusal(log, 2, SEED, inside).code == refusals.EVOLVE_OUT_OF_TURN  # type: ignore[union-attr]
    assert evolve.close_refusal(log, 1, SEED, inside) is None
    log.apply(_call(51))
    assert evolve.close_refusal(log, 1, SEED, inside).code == refusals.EVOLVE_STEP_BUDGET  # type: ignore[union-attr]
    assert evolve.close_refusal(log, 1, SEED, None) is None  # "unchanged" always closes it
    log.apply(_closed(1, "unchanged", SEED, SEED, tokens=51))
    log.apply(_request(2, SEED, ["c3", "c4"]))
    for case in ("c3", "c4"):
        log.apply(_trial(2, SEED, case, 0))
    log.apply(_projected(2))
    log.apply(_closed(2, "unchanged", SEED, SEED))
    assert evolve.solve_refusal(log).code == refusals.EVOLVE_DONE  # type: ignore[union-attr]


def test_the_fold_names_each_dishonest_order() -> None:
    log = evolve.EvolveLog(terms(), SEED)
    # step 1 scored by a harness other than the seed, and with the cases of step 2
    kinds = {p.kind for p in log.apply(_request(1, H1, ["c3", "c4"]))}
    assert kinds == {"order", "parent"}
    log = evolve.EvolveLog(terms(), SEED)
    log.apply(_request(1, SEED, ["c1", "c2"]))
    log.apply(_trial(1, SEED, "c1", 1))
    assert [p.kind for p in log.apply(_projected(1))] == ["fixed"]  # c2 not scored yet
    assert [p.kind for p in log.apply(_trial(1, SEED, "c2", 1))] == ["fixed"]  # too late
