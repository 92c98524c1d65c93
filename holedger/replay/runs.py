"""Replaying a run with every registered check: the engine, the checks and their inputs.

The engine (holedger.replay.engine) knows no check; this module gives it the registry's
(holedger.replay.checks) with their :class:`~holedger.replay.inputs.CheckInputs`, and,
for a run read from a ledger, the way to replay its seed-baseline run from the same
ledger (:class:`LedgerBaselines`), which the ``baseline`` check is handed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import chain

from holedger.errors import HoledgerError, NotFoundError
from holedger.ledger.keys import PublicKey
from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.replay.checks import CHECKS
from holedger.replay.checks.baseline import baseline_run, capturing
from holedger.replay.context import BlobSource
from holedger.replay.engine import verify_log, with_progress
from holedger.replay.inputs import BaselineRun, CheckFactory, CheckInputs, Unavailable
from holedger.replay.report import ReplayReport


def verify_records(
    run_id: str,
    records: Iterable[bytes],
    blobs: BlobSource,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    inputs: CheckInputs | None = None,
    checks: Sequence[CheckFactory] | None = None,
    workers: int = 1,
    fast: bool = True,
) -> ReplayReport:
    """Replay one run from its record bytes in stream order with ``checks`` (default: the
    registered ones), handed ``inputs``; ``workers`` and ``fast`` as for the engine's
    ``verify_log``."""
    return verify_log(
        run_id,
        records,
        blobs,
        CHECKS if checks is None else checks,
        CheckInputs() if inputs is None else inputs,
        trusted_keys=trusted_keys,
        workers=workers,
        fast=fast,
    )


class LedgerBlobs:
    """Blobs read from the ledger database."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def blob(self, digest: str) -> bytes | None:
        try:
            return self.ledger.get_blob(digest)
        except NotFoundError:
            return None

    def redacted(self, digest: str) -> bool:
        return False


class LedgerRuns:
    """Other runs' records read from the ledger (the control runs of an audit)."""

    complete = True  # every run of the ledger: a run not here is in no ledger of this home

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def run_records(self, run_id: str) -> list[Record] | None:
        try:
            if not self.ledger.has_run(run_id):
                return None
            return list(self.ledger.records(run_id))
        except HoledgerError:
            return None


def replay_run(
    ledger: Ledger,
    run_id: str,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    inputs: CheckInputs | None = None,
    checks: Sequence[CheckFactory] | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Replay a run stored in ``ledger`` (no re-execution of anything).

    Unless ``inputs`` name a source of baseline runs, the run's pinned seed-baseline run
    is replayed from the same ledger. ``progress``, when given, is called with (records
    read, records stored) after each database batch: the checks are at most a few
    thousand records behind it.
    """
    stored = ledger.stored_count(run_id)
    if not stored:
        raise NotFoundError(f"no run {run_id}", hint="see 'holedger run list'")
    inputs = CheckInputs() if inputs is None else inputs
    if inputs.baselines is None and not inputs.baseline_replay:
        inputs = replace(inputs, baselines=LedgerBaselines(ledger, trusted_keys, inputs))
    if inputs.runs is None:
        inputs = replace(inputs, runs=LedgerRuns(ledger))
    batches = ledger.raw_record_batches(run_id)
    records = (
        chain.from_iterable(batches)
        if progress is None
        else with_progress(batches, stored, progress)
    )
    return verify_records(
        run_id,
        records,
        LedgerBlobs(ledger),
        trusted_keys=trusted_keys,
        inputs=inputs,
        checks=checks,
        workers=workers,
    )


class LedgerBaselines:
    """Baseline runs read from the ledger the run itself is in (each replayed once), with
    the task and home of the inputs of the run that pins them."""

    given = False

    def __init__(
        self,
        ledger: Ledger,
        trusted_keys: Sequence[PublicKey],
        inputs: CheckInputs | None = None,
    ) -> None:
        self.ledger = ledger
        self.trusted_keys = list(trusted_keys)
        self.inputs = (CheckInputs() if inputs is None else inputs).for_baseline()
        self._seen: dict[str, BaselineRun | Unavailable] = {}

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        if run_id not in self._seen:
            self._seen[run_id] = self._replay(run_id)
        return self._seen[run_id]

    def _replay(self, run_id: str) -> BaselineRun | Unavailable:
        # The server pins only baseline runs of its own ledger: one that is not there (or
        # an id that is no run id at all) is a fault of the log, not a file to ask for.
        try:
            stored = self.ledger.stored_count(run_id)
        except HoledgerError as exc:
            return Unavailable(f"the pinned baseline run id is unusable: {exc.message}", True)
        if not stored:
            return Unavailable(f"the pinned baseline run {run_id} is not in this ledger", True)
        checks, facts = capturing(CHECKS)
        report = replay_run(
            self.ledger, run_id, trusted_keys=self.trusted_keys, checks=checks, inputs=self.inputs
        )
        return baseline_run(run_id, report, facts)
