"""`holedger audit ...`: Harness-Delta Attribution audits of closed runs."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from holedger.errors import UsageError
from holedger.output import console, emit_json, settings, table
from holedger.replay.commands import OTHER_LOGS
from holedger.replay.options import trusted_key_option

if TYPE_CHECKING:
    from holedger.ledger.keys import PublicKey

KEY_HELP = "The auditor's private key file (make one with 'holedger audit key new FILE')."


@click.group("audit")
def audit_group() -> None:
    """Post-hoc audits of closed runs: Harness-Delta Attribution (gate, H0scale,
    shortcut findings, neutralized harness, dS = O + T + G), signed by an auditor key."""


@audit_group.group("key")
def key_group() -> None:
    """Auditor keys."""


@key_group.command("new")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--name", default="holedger-auditor", show_default=True, help="Key name.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def key_new(path: str, name: str, as_json: bool) -> None:
    """Make an auditor key (mode 0600) at PATH and print its verifier key."""
    from holedger.ledger.keys import SigningKey

    key = SigningKey.generate(name)
    key.save(Path(path))
    if as_json:
        emit_json({"path": path, "key_id": key.key_id_hex, "vkey": key.public.vkey()})
    else:
        click.echo(key.public.vkey())


@contextmanager
def _context(ctx: click.Context, key_path: str | None) -> Iterator[Any]:
    from holedger.audit.hda import AuditContext
    from holedger.audit.log import AuditLog
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger

    cfg = settings(ctx)
    auditor = None
    if key_path is not None:
        path = Path(key_path)
        if not path.is_file():
            raise UsageError(
                f"--key {key_path}: no such key file",
                hint="make one with 'holedger audit key new FILE'",
            )
        auditor = SigningKey.load(path)
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    audit = AuditContext(cfg, ledger, AuditLog(ledger.app.engine), auditor)  # type: ignore[arg-type]
    try:
        yield audit
    finally:
        audit.close()
        ledger.close()


def _need_key(key_path: str | None) -> str:
    if not key_path:
        raise UsageError(
            "this step is signed by the auditor: give --key FILE",
            hint="make one with 'holedger audit key new FILE'",
        )
    return key_path


key_option = click.option("--key", "key_path", envvar="HOLEDGER_AUDITOR_KEY", help=KEY_HELP)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@audit_group.command("open")
@click.argument("run")
@key_option
@json_option
@click.pass_context
def open_cmd(ctx: click.Context, run: str, key_path: str | None, as_json: bool) -> None:
    """Open an audit of RUN (a closed run), bound to its last checkpoint."""
    from holedger.audit.hda import open_audit, read_audit

    with _context(ctx, _need_key(key_path)) as actx:
        audit_id = open_audit(actx, run)
        state = read_audit(actx.log, audit_id)
    cp = state.opened.run_checkpoint
    if as_json:
        emit_json(
            {"audit_id": audit_id, "run_id": state.opened.run_id, "run_checkpoint": cp.model_dump()}
        )
    else:
        click.echo(f"audit {audit_id}")
        click.echo(f"run   {state.opened.run_id} at checkpoint size {cp.size}, root {cp.root}")


@audit_group.command("hda")
@click.argument("audit")
@key_option
@click.option(
    "--resamples",
    default=10_000,
    show_default=True,
    type=click.IntRange(1, 10**6),
    help="Bootstrap resamples B.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap RNG seed.")
@click.option(
    "--aggregator",
    type=click.Choice(["majority_vote", "pass_at_k"]),
    default="majority_vote",
    show_default=True,
    help="How H0scale's k attempts make one answer.",
)
@json_option
@click.pass_context
def hda_cmd(
    ctx: click.Context,
    audit: str,
    key_path: str | None,
    resamples: int,
    seed: int,
    aggregator: str,
    as_json: bool,
) -> None:
    """Run the protocol: gate, H0scale, shortcut detectors, decomposition."""
    from holedger.audit.hda import run_hda

    with _context(ctx, _need_key(key_path)) as actx:
        state = run_hda(actx, audit, resamples=resamples, seed=seed, aggregator=aggregator)  # type: ignore[arg-type]
    _print(state, as_json)


@audit_group.group("finding")
def finding_group() -> None:
    """Findings no detector makes."""


@finding_group.command("add")
@click.argument("audit")
@click.option(
    "--category",
    required=True,
    help="e.g. benchmark_threshold, "
    "reverse_engineered_rule, dataset_prior_knowledge, hard_coded_procedure.",
)
@click.option("--evidence", required=True, help="Where: file:line, trial or case ids.")
@click.option("--summary", default=None, help="One line saying what it is.")
@key_option
@json_option
@click.pass_context
def finding_add(
    ctx: click.Context,
    audit: str,
    category: str,
    evidence: str,
    summary: str | None,
    key_path: str | None,
    as_json: bool,
) -> None:
    """Add a finding, signed by the auditor key."""
    from holedger.audit.hda import add_finding

    with _context(ctx, _need_key(key_path)) as actx:
        state = add_finding(actx, audit, category, evidence, summary)
    _print(state, as_json)


@audit_group.command("neutralize")
@click.argument("audit")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(file_okay=False),
    help="The neutralized harness: H^ with the found mechanisms removed.",
)
@click.option("--parent", default=None, help="The commit it edits (must be H^, the default).")
@key_option
@json_option
@click.pass_context
def neutralize_cmd(
    ctx: click.Context,
    audit: str,
    source: str,
    parent: str | None,
    key_path: str | None,
    as_json: bool,
) -> None:
    """Commit Hneutral (parent H^), evaluate it on the search cases, decompose."""
    from holedger.audit.hda import neutralize

    with _context(ctx, _need_key(key_path)) as actx:
        state, diff = neutralize(actx, audit, Path(source), parent)
    if not as_json:
        click.echo(diff, nl=False)
    _print(state, as_json)


@audit_group.command("list")
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """The audits in this ledger."""
    from holedger.audit.hda import read_audit

    with _context(ctx, None) as actx:
        states = [read_audit(actx.log, a) for a in actx.log.audit_ids()]
    rows = [[s.audit_id, s.opened.run_id, _status(s)] for s in states]
    if as_json:
        emit_json([{"audit_id": r[0], "run_id": r[1], "status": r[2]} for r in rows])
    else:
        console().print(table("audits", ["audit", "run", "status"], rows))


@audit_group.command("show")
@click.argument("audit")
@json_option
@click.pass_context
def show_cmd(ctx: click.Context, audit: str, as_json: bool) -> None:
    """What an audit found: gate, k, findings, terms and shares (as recorded; verify
    recomputes them)."""
    from holedger.audit.hda import read_audit

    with _context(ctx, None) as actx:
        state = read_audit(actx.log, audit)
    _print(state, as_json)


@audit_group.command("verify")
@click.argument("audit", required=False)
@trusted_key_option(
    "A verifier key (name+id+key) or keyring file; pins the run's and the auditor's keys."
)
@click.option(
    "--bundle",
    "bundle",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Verify every audit of an audits bundle ('audit export') from the file alone.",
)
@json_option
@click.pass_context
def verify_cmd(
    ctx: click.Context,
    audit: str | None,
    trusted: tuple[str, ...],
    bundle: Path | None,
    as_json: bool,
) -> None:
    """Verify AUDIT: its log, its binding, and every number recomputed from the logs; or,
    with --bundle FILE, every audit in the file. Exit 0 verified, 1 verification failed."""
    from holedger.audit.verify import verify_audit
    from holedger.ledger.keys import load_trusted_keys

    keys = load_trusted_keys(list(trusted))
    if (audit is None) == (bundle is None):
        raise UsageError(
            "give an AUDIT of this home, or --bundle FILE", hint="see 'holedger audit list'"
        )
    if bundle is not None:
        from holedger.audit.bundle import verify_bundle_audits

        reports = verify_bundle_audits(bundle, keys)
        if as_json:
            emit_json({"audits": [r.as_json() for r in reports]})
        else:
            for one in reports:
                print_report(one)
        sys.exit(0 if all(r.verified for r in reports) else 1)
    assert audit is not None
    with _context(ctx, None) as actx:
        report = verify_audit(actx.settings, actx.ledger, actx.log, audit, trusted_keys=keys)
    if as_json:
        emit_json(report.as_json())
    else:
        print_report(report)
    sys.exit(0 if report.verified else 1)


@audit_group.command("export")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The audits bundle to write.",
)
@json_option
@click.pass_context
def export_cmd(ctx: click.Context, run: str, output: Path, as_json: bool) -> None:
    """Write RUN's audits, with the records and blobs verifying them needs and the task and
    candidate trees their findings and strata are recomputed from, to one file ('audit
    verify --bundle FILE' verifies it without this ledger)."""
    from holedger.audit.bundle import export_audits

    with _context(ctx, None) as actx:
        summary = export_audits(actx.ledger, run, output, actx.settings)
    if as_json:
        emit_json(summary)
    else:
        click.echo(
            f"wrote {output}: {len(summary['audits'])} audits of run {summary['run_id']}, "
            f"{len(summary['runs'])} runs, {summary['blobs']} blobs"
        )
        carried = summary["evidence"]
        if carried["task"] or carried["trees"]:
            click.echo(
                f"carried for the findings and strata: {'the task, ' if carried['task'] else ''}"
                f"{carried['trees']} candidate trees ({carried['bytes']} bytes)"
            )
        for reason in carried["not_carried"]:
            click.echo(f"not carried: {reason} (verifying the file skips what needs it)")


def replay_audit(ctx: click.Context, ledger: Any, ref: str, keys: list[Any], as_json: bool) -> None:
    """``holedger replay AUDIT``: the audit verified as ``audit verify`` does; exits. Other
    references (runs) are left to ``replay``."""
    from holedger.audit.log import AuditLog
    from holedger.audit.verify import verify_audit

    if not _is_audit(ledger, ref):
        return

    report = verify_audit(
        settings(ctx), ledger, AuditLog(ledger.app.engine), ref, trusted_keys=keys
    )
    if as_json:
        emit_json(report.as_json())
    else:
        print_report(report)
    sys.exit(0 if report.verified else 1)


def _is_audit(ledger: Any, ref: str) -> bool:
    """Whether ``ref`` names an audit (holedger audit) rather than a run."""
    from holedger.audit.log import AuditLog

    prefix = ref.strip().lower()
    if len(prefix) < 4 or any(r.startswith(prefix) for r in ledger.run_ids()):
        return False
    audits = AuditLog(ledger.app.engine, create=False).audit_ids()
    return any(a.startswith(prefix) for a in audits)


def print_report(report: Any) -> None:
    out = console()
    verdict = "VERIFIED" if report.verified else "FAILED"
    out.print(f"audit {report.audit_id} of run {report.run_id}: {verdict}")
    rows = [["ok" if ok else "FAIL", name, detail] for name, (ok, detail) in report.checks.items()]
    out.print(table("checks", ["", "check", "detail"], rows, fold=("detail",)))
    for warning in report.warnings:
        out.print(f"warning: {warning}")


def _status(state: Any) -> str:
    if state.decomposed is not None:
        return str(state.decomposed.status)
    return "opened" if state.gate is None else "running"


def audit_json(state: Any) -> dict[str, Any]:
    from holedger.audit.compute import READINGS

    d = state.decomposed
    return {
        "audit_id": state.audit_id,
        "run_id": state.opened.run_id,
        "run_checkpoint": state.opened.run_checkpoint.model_dump(),
        "auditor_key_id": state.opened.auditor_key.key_id,
        "status": _status(state),
        "gate": state.gate.gate if state.gate else None,
        "scale": (
            {
                **state.scale.scale,
                "aggregator": state.scale.aggregator,
                "s_scaled": None if state.scale.s_scaled is None else str(state.scale.s_scaled),
            }
            if state.scale
            else None
        ),
        "controls": [c.model_dump(mode="json") for c in state.controls],
        "findings": [f.model_dump(mode="json") for f in state.findings],
        "neutral": state.neutral.model_dump(mode="json") if state.neutral else None,
        "decomposition": d.decomposition if d else None,
        "transfer": d.transfer if d else None,
        "strata": state.gate.strata if state.gate else [],
        "held_out_strata": state.gate.held_out_strata if state.gate else [],
        "left_out_types": state.gate.left_out_types if state.gate else [],
        "bounds": {
            "O": "lower bound: only detected, removed overfitting",
            "G": "upper bound: not evidence of transfer",
        },
        "readings": READINGS,
    }


def _print(state: Any, as_json: bool) -> None:
    data = audit_json(state)
    if as_json:
        emit_json(data)
        return
    click.echo(f"audit {data['audit_id']} of run {data['run_id']}: {data['status']}")
    gate = data["gate"]
    if gate:
        low, high = gate["interval"]
        click.echo(
            f"gate   dS = {gate['delta']} over {len(gate['cases'])} paired cases, "
            f"95% interval [{low}, {high}], p = {gate['p_value']} (B = {gate['resamples']}, "
            f"seed {gate['seed']}): {'significant' if gate['significant'] else 'not significant'}"
        )
    scale = data["scale"]
    if scale:
        extra = "" if scale["adds_compute"] else " (H^ adds no compute: H0scale = H0, T = 0)"
        click.echo(
            f"scale  k = {scale['k']} on {scale['basis']}, {scale['aggregator']}, "
            f"S(H0scale) = {scale['s_scaled']}{extra}"
        )
    for f in data["findings"]:
        where = ", ".join(f["evidence"].get("locations", [])[:4])
        click.echo(
            f"found  {f['category']} ({f['source']}): {f['summary']}"
            + (f" at {where}" if where else "")
        )
    if data["neutral"]:
        click.echo(f"neutral {data['neutral']['commit']} (parent H^ {data['neutral']['parent']})")
    d = data["decomposition"]
    if d:
        click.echo(
            f"terms  dS = {d['delta']} = O {d['O']} (lower bound) + T {d['T']} "
            f"+ G {d['G']} (upper bound); identity {'holds' if d['identity_holds'] else 'FAILS'}"
        )
        if d["shares"]:
            s = d["shares"]
            click.echo(f"shares o = {s['o']}, t = {s['t']}, g = {s['g']}")
    for row in data["strata"]:
        click.echo(
            f"stratum {row['tag']}: {row['cases']} cases, S(H^) {row['s_candidate']}, "
            f"S(H0) {row['s_base']}, dS {row['delta']}"
        )
    for row in data["held_out_strata"]:
        click.echo(
            f"held-out stratum {row['tag']}: {row['cases']} test cases, S_test(H^) "
            f"{row['s_candidate']}, S_test(H0) {row['s_base']}, difference {row['delta']}"
        )
    for row in data["left_out_types"]:
        verdict = (
            "near-perfect: prior knowledge distilled into the harness (overfitting)"
            if row["near_perfect"]
            else "not near-perfect"
        )
        click.echo(
            f"left out {row['tag']} (no search case has it): S_test(H^) {row['s_candidate']} "
            f"on {row['cases']} test cases, S_test(H0) {row['s_base']}: {verdict}"
        )
    if data["transfer"]:
        t = data["transfer"]
        click.echo(
            f"transfer held-out gain {t['held_out_delta']} against search gain "
            f"{t['search_delta']} (below: {t['below_search']}, below half: "
            f"{t['below_half_search']}, below 0: {t['below_zero']})"
        )
        v = t.get("val_selection")
        if v:
            click.echo(
                f"val selection {v['val_selected']} (search-selected H^ {v['search_selected']}):"
                f" held-out gain {v['held_out_val_selected']} against "
                f"{v['held_out_search_selected']} (improves: {v['improves']}, worsens: "
                f"{v['worsens']}, below the search gain: {v['val_below_search_gain']})"
            )
    click.echo(
        "readings (not stated by the method, chosen here): " + "; ".join(sorted(data["readings"]))
    )


@click.command("hda")
@click.option(
    "--verify",
    "verify",
    is_flag=True,
    help="Verify each audit first and leave out, by name, those that fail.",
)
@json_option
@click.pass_context
def analysis_hda_cmd(ctx: click.Context, verify: bool, as_json: bool) -> None:
    """Harness-Delta Attribution across the audits of this ledger: mean shares o, t, g,
    the settings with o + t above one half, the dominant term per task."""
    from holedger.audit.across import setting_of, summarize
    from holedger.audit.hda import read_audit
    from holedger.audit.verify import verify_audit

    left_out: list[dict[str, Any]] = []
    with _context(ctx, None) as actx:
        settings_ = []
        for audit_id in actx.log.audit_ids():
            state = read_audit(actx.log, audit_id)
            if verify:
                report = verify_audit(actx.settings, actx.ledger, actx.log, audit_id)
                if not report.verified:
                    left_out.append({"audit_id": audit_id, "failed": report.failed_checks()})
                    continue
            run_id = state.opened.run_id
            task = "?"
            if actx.ledger.has_run(run_id):
                terms = actx.ledger.run_terms(run_id)
                task = f"{terms.task_id}@{terms.task_digest[:12]}"
            settings_.append(setting_of(state, task))
    data = summarize(settings_)
    data["left_out"] = left_out
    from holedger.audit.compute import READINGS

    data["readings"] = READINGS
    if as_json:
        emit_json(data)
        return
    out = console()
    rows = [
        [
            s["audit_id"],
            s["task"],
            s["status"],
            s["delta"] or "-",
            *(s["shares"][t] if s["shares"] else "-" for t in ("o", "t", "g")),
        ]
        for s in data["settings"]
    ]
    out.print(table("audits", ["audit", "task", "status", "dS", "o", "t", "g"], rows))
    means = data["mean_shares"]
    if means:
        out.print(
            f"mean shares over {data['decomposed']} decomposed audits: "
            f"o = {means['o']}, t = {means['t']}, g = {means['g']}"
        )
    out.print(f"o + t above one half: {data['o_plus_t_over_half']['count']}")
    v = data["val_selection"]
    if v["settings"]:
        out.print(
            f"val selection over {v['settings']} settings: mean held-out gain "
            f"{v['mean_held_out_val_selected']} (val-selected) against "
            f"{v['mean_held_out_search_selected']} (search-selected); improves "
            f"{v['improves']['count']}, worsens {v['worsens']['count']}, still below the "
            f"search gain {v['still_below_search_gain']['count']}"
        )
    t = data["transfer"]
    out.print(
        f"held-out gain of {t['settings']} scored settings: below the search gain in "
        f"{t['below_search']['count']}, below half of it in {t['below_half_search']['count']}, "
        f"below 0 in {t['below_zero']['count']}"
    )
    for task, d in data["dominant_term_per_task"].items():
        out.print(f"dominant term on {task}: {d['term']} ({d['settings']} audits)")
    for item in left_out:
        out.print(f"left out {item['audit_id']}: fails {', '.join(item['failed'])}")
    out.print("O is a lower bound, G an upper bound (not evidence of transfer)")
    out.print(
        "readings (not stated by the method, chosen here): " + "; ".join(sorted(data["readings"]))
    )


def register(cli: click.Group) -> None:
    from holedger.bundles.attachments import Attachment, Verdict
    from holedger.bundles.attachments import register as carry

    # export --audits, and verify, of run bundles; their code loads when used, not at start
    def make(ledger: Any, settings: Any, run_id: str) -> bytes:
        from holedger.audit.bundle import attachment

        return attachment().make(ledger, settings, run_id)

    def verify(data: bytes, run_id: str, trusted: Sequence[PublicKey]) -> Verdict:
        from holedger.audit.bundle import attachment

        return attachment().verify(data, run_id, trusted)

    carry(Attachment("audits", make, verify))
    cli.add_command(audit_group)
    if replay_audit not in OTHER_LOGS:
        OTHER_LOGS.append(replay_audit)
    analysis = cli.commands.get("analysis")
    if isinstance(analysis, click.Group):
        analysis.add_command(analysis_hda_cmd)
