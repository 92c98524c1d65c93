"""The HDA protocol as audit steps: open an audit on a closed run, run the protocol
(gate, H0scale, shortcut detectors, decomposition), add a finding by hand, neutralize.

Each step reads the logs, asks the trusted server for control evaluations where it
needs them (:mod:`holedger.audit.control`) and appends signed events to the audit's own
stream (:mod:`holedger.audit.log`); the numbers come from :mod:`holedger.audit.compute`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from holedger.audit import compute, detectors, stats
from holedger.audit.control import Controls, control_trials
from holedger.audit.events import (
    AuditOpened,
    AuditRole,
    CheckpointRef,
    ControlEvaluated,
    Decomposed,
    FindingRecorded,
    GateComputed,
    NeutralCommitted,
    ScaleDerived,
)
from holedger.audit.evidence import (
    added_lines,
    answers_for,
    case_facts,
    case_tags,
    held_out,
    unified_diff,
)
from holedger.audit.facts import (
    RunFacts,
    RunStore,
    Trial,
    read_run,
    response_text,
    trial_facts,
)
from holedger.audit.log import AuditLog, AuditRecord
from holedger.config import Settings
from holedger.errors import NotFoundError, UsageError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.schemas.events import PublicKeyInfo
from holedger.server.candidates import CandidateRepo
from holedger.server.controls import ControlRun
from holedger.server.service import RunConfig
from holedger.server.taskview import ServerTask, load_server_task

Item = tuple[str, BaseModel, AuditRole]
TaskLoader = Callable[[str], ServerTask]


@dataclass
class AuditContext:
    """Everything an audit step uses: home, ledger, audit log, keys, how to get the task."""

    settings: Settings
    ledger: Ledger
    log: AuditLog
    auditor: SigningKey
    task_loader: TaskLoader = load_server_task
    gateway: Any = "auto"
    server_key: SigningKey | None = None
    notes: list[str] = field(default_factory=list)
    server_ledger: Ledger | None = None

    def writer(self, server: SigningKey) -> Ledger:
        """The ledger opened with the run's server key, which signs control evaluations
        (and the control runs): this context's own when it holds that key."""
        if self.ledger.signers["server"].key_id_hex == server.key_id_hex:
            return self.ledger
        if self.server_ledger is None:
            self.server_ledger = Ledger.open(self.settings.ledger_url, server, create_tables=False)
        return self.server_ledger

    def close(self) -> None:
        if self.server_ledger is not None:
            self.server_ledger.close()
            self.server_ledger = None

    def server(self, run: RunFacts) -> SigningKey:
        key = self.server_key or SigningKey.load(self.settings.key_path)
        if key.key_id_hex != run.server_key.get("key_id"):
            raise UsageError(
                f"this home's key {key.key_id_hex} is not the server key of run {run.run_id}",
                hint="run control evaluations in the home of the server that ran the run",
            )
        return key


def _pub(key: SigningKey) -> PublicKeyInfo:
    return PublicKeyInfo(name=key.name, key_id=key.key_id_hex, public_key=key.public.b64)


def open_audit(ctx: AuditContext, run_ref: str) -> str:
    """AuditOpened bound to the run's last checkpoint; refuses an open run and an auditor
    key that is the run's server key."""
    run_id = ctx.ledger.resolve_run(run_ref)
    run = read_run(run_id, ctx.ledger.records(run_id))
    if not run.closed or not run.checkpoints:
        raise UsageError(
            f"run {run_id} is open: an audit binds to a closed run",
            hint="audit it once it is nominated and closed",
        )
    if ctx.auditor.public.b64 == run.server_key.get("public_key"):
        raise UsageError(
            f"the auditor key {ctx.auditor.key_id_hex} is the server key of run {run_id}",
            hint="make an auditor key of its own with 'holedger audit key new FILE'",
        )
    size = max(run.checkpoints)
    opened = AuditOpened(
        run_id=run_id,
        run_checkpoint=CheckpointRef(size=size, root=run.checkpoints[size]),
        run_server_key=PublicKeyInfo.model_validate(run.server_key),
        auditor_key=_pub(ctx.auditor),
        readings=compute.READINGS,
    )
    audit_id = ctx.log.new_id()
    ctx.log.append(audit_id, [("AuditOpened", opened, "auditor")], {"auditor": ctx.auditor})
    return audit_id


@dataclass
class AuditState:
    """An audit's events read back: its binding, and what each step recorded."""

    audit_id: str
    records: list[AuditRecord]
    opened: AuditOpened
    controls: list[ControlEvaluated]
    gate: GateComputed | None
    scale: ScaleDerived | None
    findings: list[FindingRecorded]
    neutral: NeutralCommitted | None
    decomposed: Decomposed | None


def _own_audit(ctx: AuditContext, audit_ref: str) -> AuditState:
    """The audit a step appends to; refused, before anything is written, when the step's
    key is not the audit's auditor key (its events would not verify)."""
    state = read_audit(ctx.log, audit_ref)
    own = state.opened.auditor_key
    if ctx.auditor.public.b64 != own.public_key:
        raise UsageError(
            f"the key {ctx.auditor.key_id_hex} is not the auditor key {own.key_id} of audit "
            f"{state.audit_id}",
            hint="give the key that opened it, or open an audit of your own",
        )
    return state


def read_audit(log: AuditLog, audit_ref: str) -> AuditState:
    audit_id = log.resolve(audit_ref)
    records = log.records(audit_id)
    if not records or records[0].type != "AuditOpened":
        raise UsageError(f"audit {audit_id} does not start with AuditOpened")
    state = AuditState(
        audit_id,
        records,
        AuditOpened.model_validate(records[0].payload),
        [],
        None,
        None,
        [],
        None,
        None,
    )
    for rec in records[1:]:
        p = rec.payload
        if rec.type == "ControlEvaluated":
            state.controls.append(ControlEvaluated.model_validate(p))
        elif rec.type == "GateComputed":
            state.gate = GateComputed.model_validate(p)
        elif rec.type == "ScaleDerived":
            state.scale = ScaleDerived.model_validate(p)
        elif rec.type == "FindingRecorded":
            state.findings.append(FindingRecorded.model_validate(p))
        elif rec.type == "NeutralCommitted":
            state.neutral = NeutralCommitted.model_validate(p)
        elif rec.type == "Decomposed":
            state.decomposed = Decomposed.model_validate(p)
    return state


def _nominee(run: RunFacts) -> str:
    if run.nominee is None:
        raise UsageError(
            f"run {run.run_id} has no nominated candidate: there is no H^ to attribute",
        )
    return run.nominee


def _loaded_task(ctx: AuditContext, run_id: str) -> tuple[ServerTask, str | None]:
    config = RunConfig.load(ctx.settings, run_id)
    return ctx.task_loader(config.task), config.backend


def _controls(
    ctx: AuditContext,
    state: AuditState,
    task: ServerTask,
    backend: str | None,
    server: SigningKey,
) -> Controls:
    """The audit step's control evaluations, its control run opened on first use."""
    run_id = state.opened.run_id
    writer = ctx.writer(server)
    return Controls(
        writer,
        run_id,
        lambda: ControlRun(
            ctx.settings,
            writer,
            task,
            audit_id=state.audit_id,
            auditor_key_id=state.opened.auditor_key.key_id,
            run_id=run_id,
            backend=backend,
            gateway=ctx.gateway,
        ),
    )


def _val_selected(
    ctx: AuditContext,
    state: AuditState,
    task: ServerTask,
    backend: str | None,
    server: SigningKey,
    run: RunFacts,
    controls: Controls,
) -> list[Trial]:
    """B5: the val-selected candidate scored on the held-out split (K attempts on every
    test case) in a control run of its own, when it is not H^ and the run was scored."""
    assert run.nominee is not None
    chosen = compute.val_selected(run, run.nominee)
    if run.held_out is None or chosen is None or chosen == run.nominee:
        return []
    scorer = ControlRun(
        ctx.settings,
        ctx.writer(server),
        task,
        audit_id=state.audit_id,
        auditor_key_id=state.opened.auditor_key.key_id,
        run_id=run.run_id,
        backend=backend,
        gateway=ctx.gateway,
        baseline=True,
    )
    try:
        scorer.commit_chain(ctx.settings.run_repo(run.run_id), run.parents, run.seed_commit, chosen)
        return controls.scored(scorer, "Hval", chosen)
    finally:
        scorer.close()


def run_hda(
    ctx: AuditContext,
    audit_ref: str,
    *,
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = 0,
    aggregator: stats.Aggregator = "majority_vote",
) -> AuditState:
    """Gate, H0scale, detectors, and the decomposition when nothing needs neutralizing."""
    state = _own_audit(ctx, audit_ref)
    if state.gate is not None:
        raise UsageError(f"audit {state.audit_id} has run its protocol already")
    run_id = state.opened.run_id
    run = read_run(run_id, ctx.ledger.records(run_id))
    hhat = _nominee(run)
    server = ctx.server(run)
    task, backend = _loaded_task(ctx, run_id)
    cases = compute.search_set(run, hhat)
    hhat_trials = compute.on_cases(run.search_trials(hhat), cases)
    attempts = compute.attempts_of(hhat_trials)
    h0_trials = compute.on_cases(run.search_trials(run.seed_commit), cases)
    items: list[Item] = []
    controls = _controls(ctx, state, task, backend, server)
    try:
        lacking = compute.missing(h0_trials, cases)
        if lacking:
            h0_trials += controls.evaluate("H0", run.seed_commit, lacking, attempts)
        result = compute.gate(
            hhat_trials, h0_trials, resamples=resamples, seed=seed, alpha=stats.DEFAULT_ALPHA
        )
        items.append(
            (
                "GateComputed",
                GateComputed(
                    gate=result.as_json(),
                    sources={"Hhat": hhat, "H0": run.seed_commit, "attempts": str(attempts)},
                    strata=compute.strata(hhat_trials, h0_trials, case_tags(task.ref)),
                    **held_out(ctx.ledger, run, case_facts(task.ref)),
                ),
                "auditor",
            )
        )
        if not result.significant:
            items.append(
                (
                    "Decomposed",
                    Decomposed(
                        status="not_significant", decomposition=None, transfer=None, strata=[]
                    ),
                    "auditor",
                )
            )
            return _append(ctx, state, items, server, controls)
        factor = compute.scale(hhat_trials, h0_trials)
        all_cases = [c for ids in cases.values() for c in ids]
        if factor.k > 1:
            scaled = controls.evaluate("H0scale", run.seed_commit, cases, factor.k * attempts)
            s_scaled = compute.s_scaled(
                scaled, answers_for(ctx.ledger, scaled), all_cases, factor.k, aggregator
            )
        else:
            s_scaled = result.s_base  # H0scale = H0: T = 0, as recorded
        items.append(
            (
                "ScaleDerived",
                ScaleDerived(scale=factor.as_json(), aggregator=aggregator, s_scaled=s_scaled),
                "auditor",
            )
        )
        hval = _val_selected(ctx, state, task, backend, server, run, controls)
        found = _detect(ctx, task, run, hhat, hhat_trials, h0_trials)
        items += [
            (
                "FindingRecorded",
                FindingRecorded(
                    category=f.category,
                    source="detector",
                    summary=f.summary,
                    evidence=f.as_json(),
                ),
                "auditor",
            )
            for f in found
        ]
        if not found:
            # Nothing detected: Hneutral = H^ and O = 0 (a reading, named in the output).
            items.append(
                (
                    "Decomposed",
                    _decomposed(run, result, s_scaled, result.s_candidate, hval),
                    "auditor",
                )
            )
        else:
            items.append(
                (
                    "Decomposed",
                    Decomposed(
                        status="pending_neutral", decomposition=None, transfer=None, strata=[]
                    ),
                    "auditor",
                )
            )
    finally:
        controls.close()
    return _append(ctx, state, items, server, controls)


def _detect(
    ctx: AuditContext,
    task: ServerTask,
    run: RunFacts,
    hhat: str,
    hhat_trials: list[Trial],
    h0_trials: list[Trial],
) -> list[detectors.Finding]:
    cases = case_facts(task.ref)
    repo = CandidateRepo(ctx.settings.run_repo(run.run_id))
    added = added_lines(repo, run.seed_commit, hhat)
    return detect_from(ctx.ledger, cases, added, hhat_trials, h0_trials, run)


def detect_from(
    ledger: RunStore,
    cases: dict[str, detectors.CaseFacts],
    added: list[detectors.AddedLine],
    hhat_trials: list[Trial],
    h0_trials: list[Trial],
    run: RunFacts,
) -> list[detectors.Finding]:
    """The detectors over the logs' trials (answers and model responses from blobs)."""
    both = [*hhat_trials, *h0_trials]
    answers = answers_for(ledger, both)
    responses = {
        t.trial_id: [response_text(ledger.get_blob(d)) for d in run.responses.get(t.trial_id, [])]
        for t in both
    }
    return detectors.detect(
        trial_facts(hhat_trials, answers, responses),
        trial_facts(h0_trials, answers, responses),
        cases,
        added,
    )


def _decomposed(
    run: RunFacts,
    gate: stats.GateResult,
    s_scaled: Fraction,
    s_neutral: Fraction,
    hval: Sequence[Trial],
) -> Decomposed:
    assert run.nominee is not None
    parts = stats.decompose(gate.s_candidate, gate.s_base, s_scaled, s_neutral)
    transfer = compute.transfer_of(run, run.nominee, gate.delta, hval)
    return Decomposed(
        status="decomposed", decomposition=parts.as_json(), transfer=transfer, strata=[]
    )


def _append(
    ctx: AuditContext,
    state: AuditState,
    items: list[Item],
    server: SigningKey,
    controls: Controls | None = None,
) -> AuditState:
    """Record the step's control evaluations in the audited run (after its RunClosed),
    then the step's events, led by the ControlEvaluated naming them, in the audit."""
    made: list[Item] = list(controls.record()) if controls is not None else []
    ctx.log.append(state.audit_id, made + items, {"auditor": ctx.auditor, "server": server})
    return read_audit(ctx.log, state.audit_id)


def add_finding(
    ctx: AuditContext, audit_ref: str, category: str, evidence: str, summary: str | None
) -> AuditState:
    if category not in (*detectors.CATEGORIES, *detectors.MANUAL_CATEGORIES):
        raise UsageError(
            f"unknown finding category {category!r}",
            hint="one of " + ", ".join((*detectors.MANUAL_CATEGORIES, *detectors.CATEGORIES)),
        )
    if not evidence.strip():
        raise UsageError("--evidence is empty", hint="name the file:line, trials or cases")
    state = _own_audit(ctx, audit_ref)
    finding = FindingRecorded(
        category=category,
        source="manual",
        summary=(summary or evidence)[:2000],
        evidence={"text": evidence[:4000], "signer": ctx.auditor.key_id_hex},
    )
    ctx.log.append(
        state.audit_id, [("FindingRecorded", finding, "auditor")], {"auditor": ctx.auditor}
    )
    return read_audit(ctx.log, state.audit_id)


def neutralize(
    ctx: AuditContext, audit_ref: str, source: Path, parent: str | None = None
) -> tuple[AuditState, str]:
    """Commit ``source`` with parent Ĥ in a control run, evaluate it on the search cases
    with the audit's attempts, and decompose. Returns the new state and the diff."""
    state = _own_audit(ctx, audit_ref)
    if state.gate is None or state.scale is None:
        raise UsageError(
            f"audit {state.audit_id} has no significant gate and scale yet",
            hint="run 'holedger audit hda' first",
        )
    run_id = state.opened.run_id
    run = read_run(run_id, ctx.ledger.records(run_id))
    hhat = _nominee(run)
    if parent is not None and not hhat.startswith(parent.lower()):
        raise UsageError(
            f"the neutralized commit's parent must be H^ ({hhat[:12]}), not {parent}",
            hint="neutralize the nominated candidate",
        )
    if state.neutral is not None:
        raise UsageError(f"audit {state.audit_id} has a neutralized commit already")
    if not source.is_dir():
        raise UsageError(f"--from {source}: not a folder")
    server = ctx.server(run)
    task, backend = _loaded_task(ctx, run_id)
    cases = compute.search_set(run, hhat)
    attempts = int(state.gate.sources.get("attempts", "1"))
    controls = _controls(ctx, state, task, backend, server)
    items: list[Item] = []
    try:
        control = controls.run()
        control.commit_chain(ctx.settings.run_repo(run_id), run.parents, run.seed_commit, hhat)
        committed = control.commit_files(source, hhat)
        if committed.parent != hhat:
            raise UsageError(f"the neutralized commit's parent is {committed.parent}, not H^")
        repo = CandidateRepo(ctx.settings.run_repo(control.run_id))
        diff = unified_diff(repo, hhat, committed.candidate)
        digest = ctx.ledger.put_blob(diff.encode())
        items.append(
            (
                "NeutralCommitted",
                NeutralCommitted(
                    commit=committed.candidate,
                    parent=hhat,
                    control_run_id=control.run_id,
                    changed_paths=list(committed.changed_paths),
                    diff_digest=digest,
                ),
                "auditor",
            )
        )
        got = controls.evaluate("Hneutral", committed.candidate, cases, attempts)
    finally:
        controls.close()
    all_cases = [c for ids in cases.values() for c in ids]
    hval = control_trials(ctx.ledger, state.controls, "Hval")
    gate = _gate_of(state)
    s_neutral = compute.s_of(got, all_cases)
    s_scaled = Fraction(str(state.scale.s_scaled))
    items.append(("Decomposed", _decomposed(run, gate, s_scaled, s_neutral, hval), "auditor"))
    return _append(ctx, state, items, server, controls), diff


def _gate_of(state: AuditState) -> stats.GateResult:
    assert state.gate is not None
    g = state.gate.gate
    return stats.GateResult(
        cases=tuple(g["cases"]),
        s_candidate=Fraction(g["s_candidate"]),
        s_base=Fraction(g["s_base"]),
        delta=Fraction(g["delta"]),
        resamples=int(g["resamples"]),
        seed=int(g["seed"]),
        alpha=Fraction(g["alpha"]),
        low=Fraction(g["interval"][0]),
        high=Fraction(g["interval"][1]),
        p_value=Fraction(g["p_value"]),
        significant=bool(g["significant"]),
    )


def not_found_audit(audit: str) -> NotFoundError:
    return NotFoundError(f"no audit {audit}", hint="see 'holedger audit list'")
