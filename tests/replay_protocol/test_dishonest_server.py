"""A dishonest server is caught: validly signed events that break the protocol fail replay.

Each test writes an otherwise honest run through ``Ledger.append`` with the run's own key
and one lie in it; replay must fail the named check at the lying event's seq.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.replay.report import ReplayReport
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import CaseScores

from .runs import (
    DEV,
    E_H0,
    TEST,
    VAL,
    K,
    RunWriter,
    checks,
    failures_of,
    honest_finish,
    honest_search,
    score_of,
    terms,
)

SEED = "a" * 40
CAND = "b" * 40


def _writer(ledger: Ledger, **budget: Any) -> RunWriter:
    writer = RunWriter(ledger, terms(seed_commit=SEED, **budget))
    writer.commit(SEED)
    writer.commit(CAND)
    return writer


def _only_failing(report: ReplayReport, *names: str) -> None:
    assert not report.verified
    failed = {name for name, ok in checks(report).items() if not ok}
    assert failed == set(names), report.failures


# ------------------------------------------------------------------ (a) budget


def test_a_accepted_request_over_the_calls_budget_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger, dev_calls=1)
    writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    rid, seq = writer.request(CAND, "dev", [DEV[1].id], 1, decision="accepted", reason=None)
    writer.run_trials(rid, CAND, "dev", [DEV[1].id], 1)
    writer.project(rid, "dev")
    writer.close()
    report = replay(writer.run_id)
    _only_failing(report, "budget")
    (failure,) = failures_of(report, "budget")
    assert failure.startswith(f"{seq}:EvaluationRequested:")
    assert "accepted but dev calls budget exceeded" in failure


def test_a_accepted_request_over_the_case_pass_budget_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in DEV]
    writer.evaluate(CAND, "dev", ids, 2)  # 2 of 3 case-passes
    rid, seq = writer.request(CAND, "dev", ids, 2, decision="accepted", reason=None)
    writer.run_trials(rid, CAND, "dev", ids, 2)
    writer.project(rid, "dev")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "budget")
    assert failure.startswith(f"{seq}:") and "dev case_passes budget exceeded" in failure


def test_understated_budget_before_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    rid, seq = writer.request(CAND, "dev", [DEV[1].id], 1, budget_before=rules.no_use())
    writer.run_trials(rid, CAND, "dev", [DEV[1].id], 1)
    writer.project(rid, "dev")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "budget")
    assert failure.startswith(f"{seq}:") and "budget_before" in failure


def test_undercharged_cost_is_caught(ledger: Ledger, replay: Callable[..., ReplayReport]) -> None:
    writer = _writer(ledger)
    cheap = rules.request_cost(len(DEV), 1, 1)
    rid, seq = writer.request(CAND, "dev", [c.id for c in DEV], 1, cost=cheap)
    writer.run_trials(rid, CAND, "dev", [c.id for c in DEV], 1)
    writer.project(rid, "dev")
    writer.close()
    failures = failures_of(replay(writer.run_id), "budget")
    assert any(f.startswith(f"{seq}:") and "recorded cost" in f for f in failures)


def test_request_rejected_although_it_fits_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    _, seq = writer.request(CAND, "dev", [DEV[0].id], 1, decision="rejected", reason="busy")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "budget")
    assert failure.startswith(f"{seq}:") and "fits the budget" in failure


def test_request_rejected_with_the_wrong_code_is_caught_whatever_its_text(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    # Over the calls budget, recorded as a case_passes refusal under the calls wording:
    # replay compares codes, so the right-looking text does not save it.
    writer = _writer(ledger, dev_calls=1)
    writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    right = rules.budget_decision(
        writer.terms.budget, writer.used, "dev", rules.request_cost(len(DEV), 1, 1)
    )
    assert right is not None and right.code == "budget.calls"
    _, seq = writer.request(CAND, "dev", [DEV[1].id], 1, code="budget.case_passes")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "budget")
    assert failure.startswith(f"{seq}:")
    assert "code budget.case_passes" in failure and "the rules say budget.calls" in failure


def test_a_reworded_refusal_with_the_rules_code_verifies(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    # The text is for people: any wording verifies when the code is the rule's.
    writer = _writer(ledger, dev_calls=1)
    writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    writer.request(CAND, "dev", [DEV[1].id], 1, reason="no calls left on dev")
    writer.close()
    assert failures_of(replay(writer.run_id), "budget") == []


def test_a_refusal_without_a_code_is_read_by_the_old_wording(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    # A log from before codes: the recorded text alone, in that time's wording, verifies;
    # another rule's wording does not.
    writer = _writer(ledger, dev_calls=1)
    writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    writer.request(CAND, "dev", [DEV[1].id], 1, code=None)
    _, seq = writer.request(CAND, "dev", [DEV[2].id], 1, code=None, reason="no cases requested")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "budget")
    assert failure.startswith(f"{seq}:") and "code protocol.no_cases" in failure


# ------------------------------------------------------------------ (b) val per-case


def test_b_val_projection_with_per_case_data_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in VAL[:5]]
    rid, _ = writer.request(CAND, "val", ids, 1)
    writer.run_trials(rid, CAND, "val", ids, 1)
    # the dev-style per-case body for a val request, labelled with the val policy
    views = [rules.trial_view(t) for t in writer.trials[rid]]
    _, per_case = rules.project("dev", writer.terms.disclosure, views)
    seq = writer.project(rid, "val", edit=lambda _: per_case)
    writer.close()
    report = replay(writer.run_id)
    _only_failing(report, "disclosure")
    (failure,) = failures_of(report, "disclosure")
    assert failure.startswith(f"{seq}:DisclosureProjected:")
    assert "not aggregate-only" in failure


def test_b_val_projection_under_the_per_case_policy_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in VAL[:5]]
    rid, _ = writer.request(CAND, "val", ids, 1)
    writer.run_trials(rid, CAND, "val", ids, 1)
    seq = writer.project(rid, "val", policy="per_case")
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:") and "val policy is aggregate only" in failure


def test_val_aggregate_below_the_minimum_cases_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in VAL[:2]]
    # accepted although below min_aggregate_cases: budget and disclosure both object
    rid, req_seq = writer.request(CAND, "val", ids, 1, decision="accepted", reason=None)
    writer.run_trials(rid, CAND, "val", ids, 1)
    body = {"cases": 2, "trials": 2, "mean": "1/2"}
    seq = writer.project(rid, "val", edit=lambda _: body, policy="aggregate")
    writer.close()
    report = replay(writer.run_id)
    _only_failing(report, "budget", "disclosure")
    assert failures_of(report, "budget")[0].startswith(f"{req_seq}:")
    (failure,) = failures_of(report, "disclosure")
    assert failure.startswith(f"{seq}:") and "below the minimum 5" in failure


def test_projection_of_the_test_split_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    rid = writer.heldout(CAND)
    body = {"cases": len(TEST), "trials": len(TEST) * K, "mean": "1/2"}
    from holedger.schemas.events import DisclosureProjected

    seq = writer.append(
        "DisclosureProjected",
        DisclosureProjected(
            request_id=rid,
            split="test",
            policy="aggregate",
            projection=body,
            projection_digest=rules.projection_digest(body),
        ),
    )
    writer.scored(CAND)
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:") and "discloses the test split" in failure


# ------------------------------------------------------------------ (c) test before nomination


def test_c_test_trial_before_nomination_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    rid = writer.evaluate(CAND, "dev", [DEV[0].id], 1)
    # a test-split trial smuggled in under a dev request, before any nomination
    seq = writer.trial(rid, CAND, "test", TEST[0].id, 0)
    writer.close()
    report = replay(writer.run_id)
    sealed = failures_of(report, "test_split_sealed")
    assert sealed == [
        f"{seq}:TrialCompleted:test-split trial {rid}/{TEST[0].id}/0 ({TEST[0].id}#0) "
        "before nomination"
    ]
    assert not checks(report)["test_split_sealed"]


def test_c_accepted_test_request_before_nomination_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in TEST]
    rid, seq = writer.request(CAND, "test", ids, K, decision="accepted", reason=None)
    writer.run_trials(rid, CAND, "test", ids, K)
    writer.close()
    report = replay(writer.run_id)
    sealed = failures_of(report, "test_split_sealed")
    assert sealed[0].startswith(f"{seq}:EvaluationRequested:") and "before nomination" in sealed[0]
    assert len(sealed) == 1 + len(ids) * K  # the request and every one of its trials
    assert any("test split is closed" in f for f in failures_of(report, "budget"))


def test_test_trial_of_another_candidate_after_nomination_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    rid, _ = writer.request(SEED, "test", [TEST[0].id], K)
    seq = writer.trial(rid, SEED, "test", TEST[0].id, 0)
    writer.scored(CAND)
    writer.close()
    sealed = failures_of(replay(writer.run_id), "test_split_sealed")
    assert any(f.startswith(f"{seq}:") and "not nominated" in f for f in sealed)


# ------------------------------------------------------------------ (d) projection mean


def test_d_val_projection_whose_mean_differs_from_its_trials_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    ids = [c.id for c in VAL[:5]]
    rid, _ = writer.request(CAND, "val", ids, 1)
    writer.run_trials(rid, CAND, "val", ids, 1)
    true_mean = rules.mean([t.score for t in writer.trials[rid]])
    inflated = rational_to_str(min(true_mean + Fraction(1, 10), Fraction(1)) or Fraction(1, 10))
    seq = writer.project(rid, "val", edit=lambda body: {**body, "mean": inflated})
    writer.close()
    report = replay(writer.run_id)
    _only_failing(report, "disclosure")
    (failure,) = failures_of(report, "disclosure")
    assert failure.startswith(f"{seq}:DisclosureProjected:")
    assert f"shows mean '{inflated}'; its trials' mean is {rational_to_str(true_mean)}" in failure


def test_d_dev_projection_with_a_changed_case_mean_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id, DEV[1].id], 2)
    writer.run_trials(rid, CAND, "dev", [DEV[0].id, DEV[1].id], 2)

    def edit(body: dict[str, Any]) -> dict[str, Any]:
        case = dict(body["cases"][DEV[1].id])
        case["mean"] = "7/8"
        return {**body, "cases": {**body["cases"], DEV[1].id: case}}

    seq = writer.project(rid, "dev", edit=edit)
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:") and f"case {DEV[1].id} mean '7/8'" in failure


def test_projection_digest_that_is_not_the_body_digest_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    from holedger.schemas.events import DisclosureProjected

    writer = _writer(ledger)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id], 1)
    writer.run_trials(rid, CAND, "dev", [DEV[0].id], 1)
    views = [rules.trial_view(t, {"answer": "ans-dev-0-0"}) for t in writer.trials[rid]]
    _, body = rules.project("dev", writer.terms.disclosure, views)
    seq = writer.append(
        "DisclosureProjected",
        DisclosureProjected(
            request_id=rid,
            split="dev",
            policy="per_case",
            projection=body,
            projection_digest="0" * 64,
        ),
    )
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:") and "not its body's digest" in failure


def test_projection_before_all_trials_and_missing_projection_are_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id, DEV[1].id], 1)
    writer.trial(rid, CAND, "dev", DEV[0].id, 0)
    writer.trials[rid] = writer.trials[rid][:1]
    early = writer.project(rid, "dev")
    late = writer.trial(rid, CAND, "dev", DEV[1].id, 0)
    rid2, seq2 = writer.request(CAND, "dev", [DEV[2].id], 1)
    writer.run_trials(rid2, CAND, "dev", [DEV[2].id], 1)
    writer.close()
    report = replay(writer.run_id)
    disclosure = failures_of(report, "disclosure")
    assert any(f.startswith(f"{early}:") and "after 1 of 2 trials" in f for f in disclosure)
    assert any(f.startswith(f"{seq2}:") and "has no projection" in f for f in disclosure)
    trials = failures_of(report, "trials_match_requests")
    assert any(f.startswith(f"{late}:") and "after its request's projection" in f for f in trials)


# ------------------------------------------------------------------ (e) scores


def test_e_run_scored_whose_g_differs_from_its_trials_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    seq = writer.scored(CAND, g=Fraction(9, 10))
    writer.close()
    report = replay(writer.run_id)
    _only_failing(report, "scores")
    (failure,) = failures_of(report, "scores")
    assert failure.startswith(f"{seq}:RunScored:RunScored g 0.9 differs from g ")


def test_e_run_scored_with_inflated_scores_and_consistent_g_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    # every number in RunScored agrees with itself, none with the trials
    per_case = [CaseScores(case_id=c.id, scores=[Fraction(1)] * K) for c in TEST]
    seq = writer.scored(
        CAND,
        per_case=per_case,
        e_h_plus=Fraction(1),
        g=rules.normalized_gain(Fraction(1), E_H0),
    )
    writer.close()
    failures = failures_of(replay(writer.run_id), "scores")
    assert all(f.startswith(f"{seq}:RunScored:") for f in failures)
    assert any("E(H+) 1 differs" in f for f in failures)
    assert any("scores ['1', '1'] differ" in f for f in failures)


def test_run_scored_with_another_baseline_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    per_case = {c.id: [score_of(CAND, c.id, a) for a in range(K)] for c in TEST}
    e_plus = rules.expected_score(per_case)
    seq = writer.scored(CAND, e_h0=Fraction(0), g=e_plus)
    writer.close()
    failures = failures_of(replay(writer.run_id), "scores")
    assert any(
        f.startswith(f"{seq}:") and "not the pinned seed baseline 1/3" in f for f in failures
    )


def test_held_out_scoring_with_missing_attempts_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    ids = [c.id for c in TEST]
    rid, _ = writer.request(CAND, "test", ids, K)
    writer.run_trials(rid, CAND, "test", ids[:-1], K)
    writer.trial(rid, CAND, "test", ids[-1], 0)
    seq = writer.scored(CAND)
    writer.close()
    report = replay(writer.run_id)
    assert any(
        f.startswith(f"{seq}:") and f"test case {ids[-1]} has attempts [0]" in f
        for f in failures_of(report, "scores")
    )
    assert any(
        "1 of 8 trials never recorded" in f for f in failures_of(report, "trials_match_requests")
    )


# ------------------------------------------------------------------ protocol order


def test_evaluating_an_uncommitted_candidate_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    writer.commit(SEED)
    ghost = "f" * 40
    rid, seq = writer.request(ghost, "dev", [DEV[0].id], 1)
    writer.run_trials(rid, ghost, "dev", [DEV[0].id], 1)
    writer.project(rid, "dev")
    writer.close()
    committed = failures_of(replay(writer.run_id), "candidates_committed")
    assert committed[0].startswith(f"{seq}:EvaluationRequested:")
    assert "never committed" in committed[0]


def test_second_nomination_is_caught(ledger: Ledger, replay: Callable[..., ReplayReport]) -> None:
    writer = _writer(ledger)
    honest_search(writer, SEED, CAND)
    writer.nominate(CAND)
    seq = writer.nominate(SEED)
    writer.heldout(CAND)
    writer.scored(CAND)
    writer.close()
    nomination = failures_of(replay(writer.run_id), "nomination")
    assert nomination == [f"{seq}:CandidateNominated:a second nomination"]


def test_trial_outside_the_requested_cases_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id], 1)
    writer.run_trials(rid, CAND, "dev", [DEV[0].id], 1)
    seq = writer.trial(rid, CAND, "dev", DEV[3].id, 0)
    writer.trials[rid] = writer.trials[rid][:1]
    writer.project(rid, "dev")
    writer.close()
    trials = failures_of(replay(writer.run_id), "trials_match_requests")
    assert any(f.startswith(f"{seq}:") and "not among request" in f for f in trials)


def test_honest_run_is_not_failed_by_these_checks(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    """The control for every test above: the same writer, no lie, verifies."""
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    assert replay(writer.run_id).verified


def test_test_trial_after_scoring_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    writer.nominate(CAND)
    writer.heldout(CAND)
    writer.scored(CAND)
    rid, _ = writer.request(CAND, "test", [c.id for c in TEST], K)
    seq = writer.trial(rid, CAND, "test", TEST[0].id, 0)
    writer.close()
    sealed = failures_of(replay(writer.run_id), "test_split_sealed")
    assert any(f.startswith(f"{seq}:") and "after RunScored" in f for f in sealed)


# ------------------------------------------------------------------ large dev answers


def _big_answers(writer: RunWriter, case_ids: list[str]) -> None:
    """Give each case's attempt 0 an answer just over the inline cap."""
    for case_id in case_ids:
        writer.answers[(case_id, 0)] = {"answer": "y" * rules.MAX_SHOWN_ANSWER_BYTES}


def test_large_dev_answers_are_shown_by_digest_and_the_run_verifies(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    cases = [DEV[0].id, DEV[1].id]
    _big_answers(writer, [DEV[0].id])
    rid = writer.evaluate(CAND, "dev", cases, 2)
    (proj,) = [r for r in ledger.records(writer.run_id) if r.type == "DisclosureProjected"]
    trials = proj.payload["projection"]["cases"][DEV[0].id]["trials"]
    assert trials[0]["answer_in_blob"] is True and trials[0]["answer"] is None
    assert "answer_in_blob" not in trials[1]
    assert proj.payload["request_id"] == rid
    honest_finish(writer, CAND)
    assert replay(writer.run_id).verified


def test_a_large_answer_shown_inline_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    _big_answers(writer, [DEV[1].id])
    rid, _ = writer.request(CAND, "dev", [DEV[1].id], 1)
    writer.run_trials(rid, CAND, "dev", [DEV[1].id], 1)
    big = writer.answer(DEV[1].id, 0)

    def show_it(body: dict[str, Any]) -> dict[str, Any]:
        case = body["cases"][DEV[1].id]
        trial = {k: v for k, v in case["trials"][0].items() if k != "answer_in_blob"}
        trial["answer"] = big
        return {**body, "cases": {DEV[1].id: {**case, "trials": [trial]}}}

    seq = writer.project(rid, "dev", edit=show_it)
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:")
    assert f"shows the answer of case {DEV[1].id} attempt 0 inline" in failure


def test_a_small_answer_withheld_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = _writer(ledger)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id], 1)
    writer.run_trials(rid, CAND, "dev", [DEV[0].id], 1)

    def hide_it(body: dict[str, Any]) -> dict[str, Any]:
        case = body["cases"][DEV[0].id]
        trial = {**case["trials"][0], "answer": None, "answer_in_blob": True}
        return {**body, "cases": {DEV[0].id: {**case, "trials": [trial]}}}

    seq = writer.project(rid, "dev", edit=hide_it)
    writer.close()
    (failure,) = failures_of(replay(writer.run_id), "disclosure")
    assert failure.startswith(f"{seq}:")
    assert "by digest only; the rules show it inline" in failure


def _sized_answer(size: int, tag: str = "q") -> str:
    text = tag * (size - 2)
    assert len(rules.answer_bytes(text)) == size
    return text


def test_an_honest_line_in_mid_projection_verifies_with_blobs_and_redacted(
    ledger: Ledger,
    replay: Callable[..., ReplayReport],
    replay_redacted: Callable[[str], ReplayReport],
) -> None:
    """First fit past the 4 MiB line, trials without an answer, trials recorded in
    reverse order: the server's line and replay's agree, with the blobs and without."""
    writer = _writer(ledger, dev_calls=4)
    n = 66
    for a in range(n):
        writer.answers[(DEV[0].id, a)] = _sized_answer(65_000 if a % 5 else 70_000)
    cases = [DEV[1].id, DEV[0].id]
    rid, _ = writer.request(CAND, "dev", cases, n, decision="accepted", reason=None)
    no_answer = {(DEV[1].id, a) for a in range(0, n, 7)}
    for case_id, attempt in reversed([(c, a) for c in cases for a in range(n)]):
        if (case_id, attempt) in no_answer:
            writer.answers[(case_id, attempt)] = None
            writer.trial(rid, CAND, "dev", case_id, attempt, answer_digest=None)
        else:
            writer.trial(rid, CAND, "dev", case_id, attempt)
    seq = writer.project(rid, "dev")
    (body,) = [r.payload["projection"] for r in ledger.records(writer.run_id) if r.seq == seq]
    shown = body["cases"][DEV[0].id]["trials"]
    assert any(t.get("answer_in_blob") for t in shown)
    assert any("answer_in_blob" not in t for t in shown)
    honest_finish(writer, CAND)
    assert checks(replay(writer.run_id))["disclosure"]
    assert checks(replay_redacted(writer.run_id))["disclosure"]
