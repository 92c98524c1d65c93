"""Verifying a bundle offline: the replay engine with the registered checks on the records
and blobs the file holds, plus the bundle's own checks; and a bundle as the source of a
run's seed-baseline run (``verify --baseline``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path

from holedger.bundles.attachments import AttachmentCheck
from holedger.bundles.checks import BundleChecks, GitCheck
from holedger.bundles.format import RunBundle, git_object_id, open_bundle
from holedger.errors import BundleError, HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.ledger.tlog import TlogPolicy
from holedger.replay.checks import CHECKS
from holedger.replay.checks.baseline import baseline_run, capturing
from holedger.replay.engine import with_progress
from holedger.replay.inputs import BaselineRun, CheckContext, CheckFactory, CheckInputs, Unavailable
from holedger.replay.report import ReplayReport
from holedger.replay.runs import verify_records

PROGRESS_EVERY = 1000  # records between two progress reports of verify_bundle


def _candidate_repo(bundle: RunBundle, where: Path) -> list[str]:
    """Write the bundled git objects that hash to their ids into a bare repository at
    ``where`` (for GitCheck and the leakage check's candidate scan); the ids of those
    that do not, which GitCheck reports."""
    import pygit2

    repo = pygit2.init_repository(str(where), bare=True)
    unhashed = []
    for oid in bundle.git_spans:
        found = bundle.git_object(oid)
        assert found is not None
        type_code, data = found
        if git_object_id(type_code, data).hex() == oid:
            repo.odb.write(type_code, data)
        else:
            unhashed.append(oid)
    return unhashed


def verify_bundle(
    path: str | Path,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    external_checkpoints: Sequence[str] = (),
    policy: TlogPolicy | None = None,
    checks: Sequence[CheckFactory] | None = None,
    progress: Callable[[int, int], None] | None = None,
    task: str | None = None,
    baseline: str | Path | BundleBaselines | None = None,
) -> ReplayReport:
    """Replay a bundle with the replay engine; returns the ReplayReport (plus sections).

    ``external_checkpoints`` are checkpoint notes published elsewhere: each must be signed
    by the run's server key and match a checkpoint of the bundled log (a rewrite or a
    truncation fails). ``policy`` (a :class:`~holedger.ledger.note.TlogPolicy`) requires
    witness cosignatures on the bundle's final checkpoint. ``checks`` defaults to the
    registered replay checks; the bundle's own checks always run. ``progress``,
    when given, is called with (records read, records in the bundle) every
    PROGRESS_EVERY records and at the end. ``task`` (a task name or folder) is the task
    the leakage audit reads (default: the task the run names, if bundled with holedger).
    ``baseline`` is the bundle of the run's seed-baseline run: it is verified too (same
    keys) and checked against the pinned E(H0) (check ``baseline``; a warning without it);
    a :class:`BundleBaselines` given instead is shared, so runs pinned to one baseline
    verify it once.
    """
    if checks is None:
        checks = CHECKS
    if baseline is not None and not isinstance(baseline, BundleBaselines):
        baseline = BundleBaselines(baseline, trusted_keys, task)

    with open_bundle(path) as bundle, tempfile.TemporaryDirectory(prefix="holedger-git-") as tmp:
        repo = Path(tmp) if bundle.git_spans else None
        unhashed: list[str] = []

        def git(ctx: CheckContext) -> GitCheck:
            return GitCheck(bundle, repo, unhashed)

        def own(ctx: CheckContext) -> BundleChecks:
            return BundleChecks(bundle, ctx.opened, external_checkpoints, policy)

        def attached(ctx: CheckContext) -> AttachmentCheck:
            data = {name: bundle.attachment(name) for name in bundle.attachment_spans}
            return AttachmentCheck(data, ctx.run_id, trusted_keys)

        try:
            # The candidates' history, when bundled, becomes one repository: GitCheck
            # re-checks the commits in it, and the leakage check scans it as replay scans
            # the run's own.
            if repo is not None:
                unhashed += _candidate_repo(bundle, repo)
            stored = bundle.records()
            records = stored
            if progress is not None:
                batches = iter(lambda: list(islice(stored, PROGRESS_EVERY)), [])
                records = with_progress(batches, len(bundle.record_spans), progress)
            return verify_records(
                bundle.run_id,
                records,
                bundle,
                trusted_keys=trusted_keys,
                checks=[*checks, git, own, attached],
                inputs=CheckInputs(task=task or None, run_repo=repo, baselines=baseline),
            )
        except HoledgerError:
            raise
        except Exception as exc:  # hostile content must end in one clear error
            raise BundleError(
                f"bundle cannot be replayed: {type(exc).__name__}: {exc}",
                hint="the bundle's content is not a run holedger can read",
            ) from exc


class BundleBaselines:
    """The baseline run in a bundle file given with ``verify --baseline``: it is verified
    when first asked for (an unreadable file raises the bundle's error, naming the file)."""

    given = True  # named by the user: the check says so when the run pins no baseline

    def __init__(
        self, path: str | Path, trusted_keys: Sequence[PublicKey], task: str | None = None
    ) -> None:
        self.path = Path(path)
        self.trusted_keys = list(trusted_keys)
        self.task = task
        self._found: BaselineRun | None = None

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        if self._found is None:
            self._found = self._verify()
        return self._found  # another run than ``run_id`` fails the comparison

    def _verify(self) -> BaselineRun:
        checks, facts = capturing(CHECKS)
        try:
            report = verify_bundle(
                self.path, trusted_keys=self.trusted_keys, checks=checks, task=self.task
            )
        except HoledgerError as exc:  # the same error, naming the file it is about
            raise type(exc)(f"baseline bundle {self.path}: {exc.message}", hint=exc.hint) from exc
        return baseline_run(report.run_id, report, facts)
