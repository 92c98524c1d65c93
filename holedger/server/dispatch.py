"""A request's trials: which they are, running them, and what of them is recorded.

The trials of one request run ``workers`` at a time, each in a trial thread of its own
that hands its sandbox to the executor (:mod:`holedger.server.executor`) and scores the
result (:class:`~holedger.server.trials.TrialRunner`). A trial whose sandbox failed is
recorded as a failed trial, never lost. An interrupt (Ctrl-C) stops the trials not yet
started and waits for the running ones, so the request is recorded whole. An executor
whose cluster went away while trials ran (ExecutorGone) fails the request instead: the
trials not yet started are dropped, and the request is left as a stopped server leaves
one, for the run's next request (or ``holedger run recover``) to record as not run.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from pydantic import BaseModel

from holedger.errors import HoledgerError
from holedger.executors.faults import ExecutorGone
from holedger.protocol import rules
from holedger.schemas.events import DisclosurePolicy, DisclosureProjected, EvaluationRequested
from holedger.schemas.types import Role
from holedger.server.progress import ProgressHook, trial_counter
from holedger.server.trials import TrialOutcome, TrialRef, TrialRunner, unfinished_trial

log = logging.getLogger(__name__)

Item = tuple[str, BaseModel, Role]


class EvaluationInterrupted(KeyboardInterrupt):
    """An interrupt while a request's trials ran, with every trial's outcome: those that
    ran, and the rest as not run. An evaluation records them and its projection, then
    interrupts; held-out scoring records nothing (nominating again finishes it)."""

    def __init__(self, outcomes: list[TrialOutcome]) -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes


def trial_refs(
    run_id: str, request: EvaluationRequested, inputs: dict[str, Any], prefix: str
) -> list[TrialRef]:
    """A request's trials in order (case ids, then attempts): trial ids ``prefix-NNNN``."""
    return [
        TrialRef(
            run_id=run_id,
            request_id=request.request_id,
            trial_id=f"{prefix}-{index:04d}",
            candidate=request.candidate,
            split=request.split,
            case_id=case_id,
            attempt=attempt,
            case_input=inputs.get(case_id),
        )
        for index, (case_id, attempt) in enumerate(
            (c, a) for c in request.case_ids for a in range(request.attempts)
        )
    ]


def run_trials(
    runner: TrialRunner,
    refs: Sequence[TrialRef],
    *,
    workers: int,
    split: str,
    progress: ProgressHook | None = None,
) -> list[TrialOutcome]:
    """Run ``refs`` (``workers`` at a time) and return their outcomes in order; on an
    interrupt, raise EvaluationInterrupted with every outcome once the running ones end."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trial") as pool:
        futures: list[Future[TrialOutcome]] = []
        ended = trial_counter(progress, split, len(refs))
        try:
            for ref in refs:
                futures.append(pool.submit(run_one, runner, ref))
                if ended is not None:
                    futures[-1].add_done_callback(ended)
            return [future.result() for future in futures]
        except ExecutorGone:  # the cluster went away: the others fail at once too
            for future in futures:
                future.cancel()
            wait(futures)
            raise
        except BaseException:  # interrupted (Ctrl-C): record what ran and what did not
            not_started = sum(future.cancel() for future in futures)
            not_started += len(refs) - len(futures)
            running = sum(not future.done() for future in futures)
            log.warning(
                "interrupted: %d trials will not run; waiting for the %d running to end "
                "(each within the task's case timeout), then recording the request",
                not_started,
                running,
            )
            _wait_through_interrupts(futures)
            outcomes = [
                future.result()
                if future is not None and not future.cancelled() and future.exception() is None
                else failed_trial(runner, ref, "not run: the evaluation was interrupted")
                for future, ref in itertools.zip_longest(futures, refs)
            ]
            raise EvaluationInterrupted(outcomes) from None


def run_one(runner: TrialRunner, ref: TrialRef) -> TrialOutcome:
    """Run one trial; a sandbox failure is recorded as a failed trial, never lost."""
    try:
        return runner.run(ref)
    except ExecutorGone:
        raise  # the request fails whole (run_trials)
    except HoledgerError as exc:
        detail = exc.one_line()
    except Exception as exc:  # the trial must be recorded whatever broke
        detail = f"{type(exc).__name__}: {exc}"
    return failed_trial(runner, ref, detail)


def failed_trial(runner: TrialRunner, ref: TrialRef, detail: str) -> TrialOutcome:
    """A trial that did not run to its end: score 0, a sandbox_error violation saying why."""
    return unfinished_trial(runner.backend, runner.limits.as_record(), ref, detail)


def _wait_through_interrupts(futures: Sequence[Future[TrialOutcome]]) -> None:
    """Wait for the futures, a further interrupt notwithstanding: a running trial ends
    within its case timeout, and leaving before then would leave its request unrecorded."""
    while True:
        try:
            wait(futures)
            return
        except KeyboardInterrupt:
            log.warning("still waiting for the running trials to end")


def projected(
    request: EvaluationRequested, policy: DisclosurePolicy, outcomes: Sequence[TrialOutcome]
) -> DisclosureProjected:
    """The DisclosureProjected of a request's trials (a dev or val request)."""
    views = [rules.trial_view(o.completed, o.answer) for o in outcomes]
    name, body = rules.project(request.split, policy, views)
    return DisclosureProjected(
        request_id=request.request_id,
        split=request.split,
        policy=name,
        projection=body,
        projection_digest=rules.projection_digest(body),
    )


def trial_items(outcomes: Sequence[TrialOutcome]) -> list[Item]:
    """The events of finished trials: each TrialCompleted, then its SafetyViolations."""
    items: list[Item] = []
    for outcome in outcomes:
        items.append(("TrialCompleted", outcome.completed, "server"))
        items.extend(("SafetyViolation", v, "server") for v in outcome.violations)
    return items
