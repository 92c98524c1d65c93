"""Verify an audit: its own log, what it is bound to, and every number in it, recomputed
from the audited run's log, the control runs' logs and the audit's events.

Checks (each named in the report; a failure names the check and the event):

* ``audit_integrity``: canonical records, seq, chain, signatures by role (auditor: the
  key AuditOpened declares; server: the audited run's server key), checkpoint roots and
  notes, a final checkpoint;
* ``audit_binding``: the run exists, has the bound checkpoint (size and root), is closed
  within it, and its server key is the one the audit names; the auditor key is not it;
* ``run_verified``: the audited run replays;
* ``controls_signed``: each control evaluation is recorded, the same, in the audited
  run's stream (AuditControlEvaluated at ``run_seq``), and every one recorded there for
  this audit is named by the audit; its control run replays, names this audit and run,
  has the stated checkpoint and request, and its trials' scores are the stated digest;
* ``controls_undisclosed``: no control evaluation is recorded in the audited run before
  its RunClosed (the optimizer could be shown it), is a request of the audited run (whose
  projections the optimizer saw), nor is run in the audited run;
* ``evidence``: the task and the candidate trees the findings and the B6 strata are
  recomputed from (in the home, or carried by an audits bundle) are the ones the run
  signed: the task hashes to RunOpened's task digest, each tree to the git tree id of its
  CandidateCommitted (holedger.audit.carried);
* ``gate``, ``scale``, ``findings``, ``neutral``, ``decomposition``: recomputed and equal
  to what the audit recorded. ``findings`` and the strata need the task and the trees:
  where they are not at hand, the check says it skipped them and a warning says what was
  not recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.audit import compute, stats
from holedger.audit.carried import Evidence, from_home
from holedger.audit.evidence import answers_for, held_out, lines_added
from holedger.audit.facts import RunFacts, RunStore, Trial, read_run, scores_digest
from holedger.audit.hda import AuditState, detect_from, read_audit
from holedger.audit.log import AuditLog, verify_records
from holedger.config import Settings
from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.ledger.store import Ledger
from holedger.protocol.runs import names_control
from holedger.replay.report import counted

CHECKS = (
    "audit_integrity",
    "audit_binding",
    "run_verified",
    "controls_signed",
    "controls_undisclosed",
    "evidence",
    "gate",
    "scale",
    "findings",
    "neutral",
    "decomposition",
)


@dataclass
class AuditReport:
    audit_id: str
    run_id: str
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # what was recomputed from the task and trees: the detector findings, the B6 strata
    recomputed: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, problems: Sequence[str], passed: str) -> None:
        self.checks[name] = (not problems, passed if not problems else problems[0])
        self.failures += [f"{name}: {p}" for p in problems]

    @property
    def verified(self) -> bool:
        return all(ok for ok, _ in self.checks.values())

    def failed_checks(self) -> list[str]:
        return [name for name, (ok, _) in self.checks.items() if not ok]

    def as_json(self) -> dict[str, Any]:
        return {
            "audit_id": self.audit_id,
            "run_id": self.run_id,
            "verified": self.verified,
            "checks": [
                {"name": name, "ok": ok, "detail": detail}
                for name, (ok, detail) in self.checks.items()
            ],
            "failed_checks": self.failed_checks(),
            "failures": self.failures,
            "warnings": self.warnings,
            "recomputed": self.recomputed,
            "readings": _readings(),
        }


def _readings() -> dict[str, str]:
    return dict(compute.READINGS)


def verify_audit(
    settings: Settings,
    ledger: RunStore,
    log: AuditLog,
    audit_ref: str,
    *,
    trusted_keys: Sequence[PublicKey] = (),
    replay_runs: bool = True,
    evidence: Callable[[RunFacts], Evidence] | None = None,
) -> AuditReport:
    """Verify an audit against ``ledger`` (a ledger, or an audits bundle's runs); the task
    and candidate trees come from ``evidence`` (an audits bundle's) or else the home."""
    state = read_audit(log, audit_ref)
    opened = state.opened
    report = AuditReport(state.audit_id, opened.run_id)
    auditor = PublicKey.declared(opened.auditor_key.name, opened.auditor_key.public_key)
    if trusted_keys and auditor.key_id_hex not in {k.key_id_hex for k in trusted_keys}:
        report.warnings.append("auditor_key_pinned: no trusted key pins the auditor key")
    run: RunFacts | None = None
    if ledger.has_run(opened.run_id):
        run = read_run(opened.run_id, ledger.records(opened.run_id))
    server = (
        PublicKey.declared(str(run.server_key["name"]), str(run.server_key["public_key"]))
        if run is not None
        else PublicKey.declared(opened.run_server_key.name, opened.run_server_key.public_key)
    )
    report.check(
        "audit_integrity",
        verify_records(state.audit_id, state.records, {"auditor": auditor, "server": server}),
        f"{len(state.records)} events signed, chained and checkpointed",
    )
    report.check("audit_binding", _binding(state, run, auditor), "bound to a closed run")
    if run is None:
        for name in CHECKS[2:]:
            report.check(name, ["the audited run is not in this ledger"], "")
        return report
    replayed = _replay(ledger, opened.run_id, trusted_keys) if replay_runs else []
    report.check("run_verified", replayed, "the audited run replays")
    controls, signed = _controls(ledger, state, run, trusted_keys, replay_runs)
    report.check("controls_signed", signed, counted(len(state.controls), "control evaluation"))
    report.check("controls_undisclosed", _undisclosed(state, run), "none shown to the optimizer")
    held = evidence(run) if evidence is not None else from_home(settings, run)
    report.check("evidence", held.problems, held.detail())
    if held.problems:  # nothing is recomputed from a task or tree that is not the run's
        held = Evidence(held.where, missing=["the task and trees are not the run's"])
    report.warnings += [f"not recomputed: {m}" for m in held.missing]
    try:
        _recompute(held, ledger, state, run, controls, report)
    except (HoledgerError, ValueError) as exc:
        later = CHECKS[CHECKS.index("gate") :]
        failing = next((n for n in later if n not in report.checks), "decomposition")
        report.check(failing, [f"cannot be recomputed from the logs: {exc}"], "")
    return report


def _binding(state: AuditState, run: RunFacts | None, auditor: PublicKey) -> list[str]:
    opened = state.opened
    if run is None:
        return [f"run {opened.run_id} is not in this ledger"]
    size, root = opened.run_checkpoint.size, opened.run_checkpoint.root
    problems = []
    if run.checkpoints.get(size) != root or run.root_at(size) != root:
        problems.append(f"run {opened.run_id} has no checkpoint of size {size} and root {root}")
    closed_at = _closed_at(run)
    if closed_at is None or closed_at >= size:
        problems.append(f"run {opened.run_id} is not closed at the bound checkpoint")
    if opened.run_server_key.model_dump() != run.server_key:
        problems.append("the audit names another server key than the run's")
    if auditor.b64 == run.server_key.get("public_key"):
        problems.append("the auditor key is the run's server key")
    return problems


def _closed_at(run: RunFacts) -> int | None:
    return run.closed_seq


def _replay(ledger: RunStore, run_id: str, trusted: Sequence[PublicKey]) -> list[str]:
    from holedger.replay.runs import replay_run

    try:
        if isinstance(ledger, Ledger):
            report = replay_run(ledger, run_id, trusted_keys=trusted)
        else:  # an audits bundle replays its runs from their bundled records
            report = ledger.replay_report(run_id, trusted)  # type: ignore[attr-defined]
    except HoledgerError as exc:
        return [f"run {run_id}: {exc.message}"]
    if report.verified:
        return []
    return [f"run {run_id} fails replay ({', '.join(report.failed_checks())})"]


def _controls(
    ledger: RunStore,
    state: AuditState,
    run: RunFacts,
    trusted: Sequence[PublicKey],
    replay_runs: bool,
) -> tuple[dict[str, list[Trial]], list[str]]:
    """Each harness's control trials, and what is wrong with the control evaluations."""
    trials: dict[str, list[Trial]] = {}
    problems: list[str] = []
    runs: dict[str, RunFacts] = {}
    problems += _recorded_in_run(state, run)
    for control in state.controls:
        cid = control.control_run_id
        where = f"control {control.request_id} ({control.harness})"
        if cid == run.run_id or not ledger.has_run(cid):
            problems.append(f"{where}: control run {cid} is not a control run in this ledger")
            continue
        if cid not in runs:
            runs[cid] = read_run(cid, ledger.records(cid))
            if replay_runs:
                problems += _replay(ledger, cid, trusted)
        facts = runs[cid]
        if facts.server_key != run.server_key:
            problems.append(f"{where}: control run {cid} is not signed by the run's server key")
        if not names_control(facts.control_of, facts.optimizer, state.audit_id, run.run_id):
            problems.append(f"{where}: control run {cid} does not name this audit and run")
        cp = control.control_checkpoint
        if facts.root_at(cp.size) != cp.root:
            problems.append(
                f"{where}: control run {cid} has no tree of size {cp.size} and that root"
            )
        got = [t for t in facts.trials if t.request_id == control.request_id]
        if control.request_id not in facts.requests or not got:
            problems.append(f"{where}: no such request with trials in control run {cid}")
            continue
        if scores_digest(got) != control.scores_digest:
            problems.append(f"{where}: its trials' scores are not the ones the server stated")
        if {t.candidate for t in got} != {control.candidate} or {t.split for t in got} != {
            control.split
        }:
            problems.append(f"{where}: its trials are of another candidate or split")
        trials.setdefault(control.harness, []).extend(got)
    return trials, problems


def _recorded_in_run(state: AuditState, run: RunFacts) -> list[str]:
    """Each control evaluation of the audit is the server's AuditControlEvaluated at its
    ``run_seq`` in the audited run, and the run records none for this audit besides."""
    problems = []
    for c in state.controls:
        recorded = run.controls.get(c.run_seq)
        same = recorded is not None and {
            "audit_id": recorded.get("audit_id"),
            "harness": recorded.get("harness"),
            "candidate": recorded.get("candidate"),
            "control_run_id": recorded.get("control_run_id"),
            "control_checkpoint": {
                "size": recorded.get("control_size"),
                "root": recorded.get("control_root"),
            },
            "request_id": recorded.get("request_id"),
            "split": recorded.get("split"),
            "case_ids": recorded.get("case_ids"),
            "attempts": recorded.get("attempts"),
            "scores_digest": recorded.get("scores_digest"),
        } == c.model_dump(mode="json", exclude={"run_seq", "disclosed"})
        if not same:
            problems.append(
                f"control {c.request_id} ({c.harness}): the audited run records no such "
                f"control evaluation for this audit at seq {c.run_seq}"
            )
    named = {c.run_seq for c in state.controls}
    problems += [
        f"the audited run records a control evaluation for this audit at seq {seq} that "
        "the audit does not name"
        for seq, p in sorted(run.controls.items())
        if p.get("audit_id") == state.audit_id and seq not in named
    ]
    return problems


def _undisclosed(state: AuditState, run: RunFacts) -> list[str]:
    shown = run.requests | run.projected
    closed = run.closed_seq if run.closed_seq is not None else float("inf")
    problems = [
        f"control {c.request_id} ({c.harness}) is recorded in the audited run at seq "
        f"{c.run_seq}, before its RunClosed: the optimizer could be shown it"
        for c in state.controls
        if c.run_seq < closed
    ]
    return problems + [
        f"control {c.request_id} ({c.harness}) is a request of the audited run: the "
        "optimizer was shown it"
        for c in state.controls
        if c.request_id in shown or c.control_run_id == run.run_id
    ]


def _recompute(
    held: Evidence,
    ledger: RunStore,
    state: AuditState,
    run: RunFacts,
    controls: dict[str, list[Trial]],
    report: AuditReport,
) -> None:
    if run.nominee is None:
        report.check("gate", ["the audited run has no nominee"], "")
        return
    hhat = run.nominee
    cases = compute.search_set(run, hhat)
    all_cases = [c for ids in cases.values() for c in ids]
    hhat_trials = compute.on_cases(run.search_trials(hhat), cases)
    h0_trials = compute.on_cases(run.search_trials(run.seed_commit), cases) + controls.get("H0", [])
    if state.gate is None:
        report.check("gate", [], "the protocol has not run yet")
        return
    recorded = state.gate.gate
    gate = compute.gate(
        hhat_trials,
        h0_trials,
        resamples=int(recorded["resamples"]),
        seed=int(recorded["seed"]),
        alpha=Fraction(recorded["alpha"]),
    )
    problems = (
        [] if gate.as_json() == recorded else ["the recorded gate is not the one the logs give"]
    )
    task_cases = held.cases
    strata_note = ""
    if task_cases:
        tags = {c.case_id: stats.case_tags(c.input) for c in task_cases.values()}
        strata = compute.strata(hhat_trials, h0_trials, tags)
        outside = held_out(ledger, run, task_cases)
        report.recomputed.update(strata=strata, **outside)
        if strata != state.gate.strata:
            problems.append("the recorded strata are not the ones the logs give")
        if outside != {
            "held_out_strata": state.gate.held_out_strata,
            "left_out_types": state.gate.left_out_types,
        }:
            problems.append("the recorded held-out strata or left-out types are not the logs'")
    else:
        strata_note = "; B6 strata not recomputed (no task)"
    report.check(
        "gate",
        problems,
        f"dS = {recorded['delta']}, p = {recorded['p_value']}, recomputed{strata_note}",
    )
    decomposed = state.decomposed
    if not gate.significant:
        ok = decomposed is not None and decomposed.status == "not_significant"
        report.check(
            "decomposition",
            [] if ok else ["a gain that is not significant was decomposed"],
            "not significant",
        )
        return
    s_scaled = _scale(ledger, state, hhat_trials, h0_trials, controls, all_cases, gate, report)
    _findings(held, ledger, state, run, hhat, hhat_trials, h0_trials, report)
    s_neutral = _neutral(ledger, state, run, hhat, controls, all_cases, gate, report)
    _decomposition(state, run, gate, s_scaled, s_neutral, controls.get("Hval", []), report)


def _scale(
    ledger: RunStore,
    state: AuditState,
    hhat_trials: list[Trial],
    h0_trials: list[Trial],
    controls: dict[str, list[Trial]],
    all_cases: list[str],
    gate: stats.GateResult,
    report: AuditReport,
) -> Fraction | None:
    if state.scale is None:
        report.check("scale", ["a significant gate without H0scale"], "")
        return None
    factor = compute.scale(hhat_trials, h0_trials)
    problems = []
    if factor.as_json() != state.scale.scale:
        problems.append("the recorded k is not the one the logs give")
    try:
        if factor.k > 1:
            scaled = controls.get("H0scale", [])
            s_scaled = compute.s_scaled(
                scaled, answers_for(ledger, scaled), all_cases, factor.k, state.scale.aggregator
            )
        else:
            s_scaled = gate.s_base
    except (ValueError, HoledgerError) as exc:
        report.check("scale", [f"S(H0scale) cannot be recomputed: {exc}"], "")
        return None
    if s_scaled != state.scale.s_scaled:
        problems.append("the recorded S(H0scale) is not the one the control trials give")
    report.check("scale", problems, f"k = {factor.k} ({factor.basis}), recomputed")
    return s_scaled


def _findings(
    held: Evidence,
    ledger: RunStore,
    state: AuditState,
    run: RunFacts,
    hhat: str,
    hhat_trials: list[Trial],
    h0_trials: list[Trial],
    report: AuditReport,
) -> None:
    old, new = held.tree(run.seed_commit), held.tree(hhat)
    if not held.cases or old is None or new is None:
        report.check("findings", [], "skipped: the task or the candidates' trees not at hand")
        return
    found = detect_from(ledger, held.cases, lines_added(old, new), hhat_trials, h0_trials, run)
    report.recomputed["findings"] = [f.as_json() for f in found]
    recorded = [f.evidence for f in state.findings if f.source == "detector"]
    problems = (
        []
        if report.recomputed["findings"] == recorded
        else ["the recorded detector findings are not what the detectors find"]
    )
    report.check("findings", problems, f"{len(found)} detector findings re-derived")


def _neutral(
    ledger: RunStore,
    state: AuditState,
    run: RunFacts,
    hhat: str,
    controls: dict[str, list[Trial]],
    all_cases: list[str],
    gate: stats.GateResult,
    report: AuditReport,
) -> Fraction | None:
    neutral = state.neutral
    if neutral is None:
        if state.findings:
            report.check("neutral", [], "pending: findings wait for a neutralized commit")
            return None
        report.check("neutral", [], "nothing detected: Hneutral = H^")
        return gate.s_candidate
    problems = []
    if neutral.parent != hhat:
        problems.append(f"the neutralized commit's parent {neutral.parent[:12]} is not H^")
    if ledger.has_run(neutral.control_run_id):
        control = read_run(neutral.control_run_id, ledger.records(neutral.control_run_id))
        if control.parents.get(neutral.commit) != hhat:
            problems.append("the control run did not commit it with parent H^")
    else:
        problems.append(f"control run {neutral.control_run_id} is not in this ledger")
    trials = [t for t in controls.get("Hneutral", []) if t.candidate == neutral.commit]
    try:
        s_neutral = compute.s_of(trials, all_cases)
    except ValueError as exc:
        problems.append(f"S(Hneutral) cannot be recomputed: {exc}")
        s_neutral = None
    report.check("neutral", problems, f"{neutral.commit[:12]}, parent H^")
    return s_neutral


def _decomposition(
    state: AuditState,
    run: RunFacts,
    gate: stats.GateResult,
    s_scaled: Fraction | None,
    s_neutral: Fraction | None,
    hval: list[Trial],
    report: AuditReport,
) -> None:
    decomposed = state.decomposed
    if decomposed is None:
        report.check("decomposition", ["the audit records no decomposition step"], "")
        return
    if s_scaled is None or s_neutral is None:
        ok = decomposed.status == "pending_neutral"
        report.check(
            "decomposition",
            [] if ok else ["decomposed without its controls"],
            "pending a neutralized commit",
        )
        return
    parts = stats.decompose(gate.s_candidate, gate.s_base, s_scaled, s_neutral)
    assert run.nominee is not None
    try:
        transfer = compute.transfer_of(run, run.nominee, gate.delta, hval)
    except ValueError as exc:
        report.check("decomposition", [f"the transfer check cannot be recomputed: {exc}"], "")
        return
    problems = []
    if decomposed.status != "decomposed" or decomposed.decomposition != parts.as_json():
        problems.append("the recorded terms or shares are not the ones the logs give")
    if decomposed.transfer != transfer:
        problems.append("the recorded transfer check is not the one the logs give")
    if not parts.identity_holds:
        problems.append("dS != O + T + G")
    report.check("decomposition", problems, f"dS = O + T + G = {parts.as_json()['delta']}")
