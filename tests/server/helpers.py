from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.server.candidates import FileEntry, read_directory
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .tinytask import PERFECT_MAIN


def candidate_with_main(service: RunService, run_id: str, task: ServerTask, main: str) -> str:
    """Commit the seed with ``harness/__main__.py`` replaced by ``main``; its commit id."""
    files = read_directory(task.seed_dir)
    files["harness/__main__.py"] = FileEntry(main.encode())
    return service.commit_candidate(run_id, files).candidate


def perfect_candidate(service: RunService, run_id: str, task: ServerTask) -> str:
    return candidate_with_main(service, run_id, task, PERFECT_MAIN)


def independent_budget_count(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Budget use counted straight from the events, without the rules module."""
    calls: Counter[str] = Counter()
    passes: dict[str, Fraction] = {"dev": Fraction(0), "val": Fraction(0)}
    decisions: Counter[str] = Counter()
    terms = ledger.run_terms(run_id).terms
    for rec in ledger.records(run_id):
        if rec.type != "EvaluationRequested":
            continue
        p = rec.payload
        decisions[p["decision"]] += 1
        if p["decision"] == "accepted" and p["split"] in passes:
            calls[p["split"]] += 1
            n = len(p["case_ids"]) * p["attempts"]
            passes[p["split"]] += Fraction(n, terms.split_sizes[p["split"]])
    return {"calls": dict(calls), "passes": passes, "decisions": dict(decisions)}


def assert_replay_verifies(ledger: Ledger, run_id: str) -> Any:
    report = replay_run(ledger, run_id)
    failed = [(c.name, c.detail) for c in report.checks if not c.ok]
    assert report.verified, (failed, report.failures[:5])
    return report


def all_runs(ledger: Ledger) -> list[str]:
    return ledger.run_ids()


def evaluate_in_background(
    service: RunService, run_id: str, candidate: str, case_ids: Sequence[str]
) -> tuple[threading.Thread, list[Any]]:
    """A dev evaluation (one attempt) started in a thread; the list gets its result."""
    done: list[Any] = []
    worker = threading.Thread(
        target=lambda: done.append(service.evaluate(run_id, candidate, "dev", case_ids, 1))
    )
    worker.start()
    return worker, done


def cli_invoker(home: Settings) -> Callable[..., str]:
    """``holedger --home HOME ARGS...`` run in this process: its output, once it exits 0."""
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(cli, ["--home", str(home.home), *args])
        assert result.exit_code == 0, result.output
        return result.output

    return invoke
