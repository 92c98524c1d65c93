"""The seed baseline: a task's E(H0), measured once by a run of its own and pinned.

Every run's RunOpened pins the seed harness's expected held-out score, E(H0). It is
measured by a baseline run (optimizer ``rules.BASELINE_OPTIMIZER``) that nominates the
seed at once, kept in the home under the task's digest, and re-checked against that run's
RunScored in the ledger each time it is read. A baseline run cut short is named in a
``.pending`` file until it is scored, so the next call finishes it instead of starting
another.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from holedger.errors import HoledgerError
from holedger.protocol import rules
from holedger.sandboxes import get_backend
from holedger.schemas.events import RunScored, SeedBaseline, TaskTerms
from holedger.server.core import RunConfig, ServerCore
from holedger.server.heldout import nominate
from holedger.server.locks import nomination_lock
from holedger.server.taskview import ServerTask

log = logging.getLogger(__name__)

# Opens a baseline run of a task (by reference, in a backend) and returns its run id.
OpenBaselineRun = Callable[[str, str | None], str]


def baseline_path(core: ServerCore, task: ServerTask, variant: str | None = None) -> Path:
    name = task.digest if variant is None else f"{task.digest}.{variant}"
    return core.settings.home / "baselines" / f"{name}.json"


def ensure_baseline(
    core: ServerCore,
    task_ref: str,
    open_run: OpenBaselineRun,
    *,
    backend: str | None = None,
    variant: str | None = None,
    seed_commit: str | None = None,
) -> SeedBaseline:
    """The task's pinned E(H0): read from the home and re-checked against its baseline
    run in the ledger, or computed once by a baseline run of its own (``open_run``).

    A seed variant (``variant``, whose tree commits to ``seed_commit``) has a baseline of
    its own, measured by a baseline run from that variant; one measured from another
    commit of it (the variant's files changed since) is not used."""
    task = core.task(task_ref)
    path = baseline_path(core, task, variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = _Seed(variant, seed_commit)
    with nomination_lock(path.with_suffix(".lock")):
        known = _read_baseline(core, task, path, seed)
        if known is not None:
            return known
        pending = path.with_suffix(".pending")
        run_id = _pending_baseline_run(core, task, pending, seed)
        if run_id is None:
            run_id = open_run(task_ref, backend)
            pending.write_text(run_id + "\n")
        if not core.states.current(run_id).closed:
            nominate(core, run_id, "seed")  # finishes a nomination cut short, too
        scored = core.states.current(run_id).scored
        assert scored is not None  # a pending run is closed only once scored
        baseline = SeedBaseline(
            e_h0=scored.e_h_plus,
            k=scored.k,
            baseline_run_id=run_id,
            per_case_digest=rules.per_case_digest((c.case_id, c.scores) for c in scored.per_case),
            e_h0_error=rules.round_error(c.scores for c in scored.per_case),
        )
        record = {"task_digest": task.digest, **baseline.model_dump(mode="json")}
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        pending.unlink(missing_ok=True)
        return baseline


@dataclass(frozen=True)
class _Seed:
    variant: str | None
    commit: str | None  # None: any (the task's own seed is pinned by its digest)

    def started(self, terms: TaskTerms) -> bool:
        """Whether a run with ``terms`` started from this seed."""
        if terms.seed_variant != self.variant:
            return False
        return self.commit is None or terms.seed_commit == self.commit


def _pending_baseline_run(
    core: ServerCore, task: ServerTask, pending: Path, seed: _Seed
) -> str | None:
    """The baseline run of ``task`` a call cut short left (named in ``pending``), when it
    is still of this task and can be finished; else None."""
    if not pending.exists():
        return None
    run_id = pending.read_text().strip()
    try:
        if not core.ledger.has_run(run_id):
            return None
        opened = core.ledger.run_terms(run_id)
        config = RunConfig.load(core.settings, run_id)
    except (HoledgerError, ValueError):
        return None
    if opened.task_digest != task.digest or opened.optimizer != rules.BASELINE_OPTIMIZER:
        return None
    if not seed.started(opened.terms):
        return None
    try:
        get_backend(config.backend)
    except HoledgerError as exc:
        log.warning(
            "the baseline run %s cut short cannot be finished (%s): starting another",
            run_id,
            exc.one_line(),
        )
        return None
    state = core.states.current(run_id)
    if state.closed and state.scored is None:
        return None  # closed without a score (aborted): start again
    return run_id


def _read_baseline(
    core: ServerCore, task: ServerTask, path: Path, seed: _Seed
) -> SeedBaseline | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data.pop("task_digest", None)
    baseline = SeedBaseline.model_validate(data)
    run_id = baseline.baseline_run_id
    if run_id is None or not core.ledger.has_run(run_id):
        return None
    opened = core.ledger.run_terms(run_id)
    if opened.task_digest != task.digest or not seed.started(opened.terms):
        return None
    for rec in core.ledger.records(run_id):
        if rec.type == "RunScored":
            scored = RunScored.model_validate(rec.payload)
            ok = scored.e_h_plus == baseline.e_h0 and scored.k == baseline.k
            return baseline if ok else None
    return None
