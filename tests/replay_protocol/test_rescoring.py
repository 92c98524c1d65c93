"""A re-scoring run (holedger rescore) scores a closed run's nominee again: its own log
must name that nominee's tree as the candidate it nominated, and hold no search."""

from __future__ import annotations

from collections.abc import Callable

from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport
from holedger.schemas.events import RescoreOf

from .runs import DEV, RunWriter, checks, failures_of, honest_finish, terms

SEED = "a" * 40
NOMINEE = "b" * 40
TREE = "1" * 40
OTHER_TREE = "2" * 40
ORIGINAL = "4b8f6a2e-1d3c-4e5f-9a7b-0c1d2e3f4a5b"


def _rescoring(ledger: Ledger, tree: str, *, search: bool = False) -> tuple[str, int]:
    of = RescoreOf(run_id=ORIGINAL, candidate=NOMINEE, tree=TREE, index=1)
    writer = RunWriter(ledger, terms(seed_commit=SEED), optimizer="rescore", rescore_of=of)
    writer.commit(SEED)
    writer.commit("c" * 40, tree=tree)
    if search:
        writer.evaluate("c" * 40, "dev", [DEV[0].id], 1)
    seq = writer.nominate("c" * 40)
    writer.heldout("c" * 40)
    writer.scored("c" * 40)
    writer.close()
    return writer.run_id, seq


def test_a_rescoring_of_the_nominee_tree_verifies(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    run, _ = _rescoring(ledger, TREE)
    report = replay(run)
    assert report.verified, report.failures
    assert checks(report)["rescoring"]
    assert report.sections["rescoring"] == {
        "run_id": ORIGINAL,
        "candidate": NOMINEE,
        "tree": TREE,
        "index": 1,
    }


def test_a_rescoring_of_another_tree_or_with_a_search_fails_rescoring(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    run, seq = _rescoring(ledger, OTHER_TREE)
    report = replay(run)
    assert {n for n, ok in checks(report).items() if not ok} == {"rescoring"}
    assert failures_of(report, "rescoring") == [
        f"{seq}:CandidateNominated:the re-scored candidate cccccccccccc has tree "
        f"222222222222, not the tree 111111111111 of run {ORIGINAL}'s nominee"
    ]
    run, _ = _rescoring(ledger, TREE, search=True)
    (failure,) = failures_of(replay(run), "rescoring")
    assert failure.endswith(":EvaluationRequested:a re-scoring run asked for dev")


def test_a_rescore_label_without_a_binding_fails_and_other_runs_have_no_such_check(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit=SEED), optimizer="rescore")
    writer.commit(SEED)
    honest_finish(writer, SEED)
    assert failures_of(replay(writer.run_id), "rescoring") == [
        "0:RunOpened:a rescore run that names no run it re-scores"
    ]
    plain = RunWriter(ledger, terms(seed_commit=SEED))
    plain.commit(SEED)
    honest_finish(plain, SEED)
    assert "rescoring" not in checks(replay(plain.run_id))
