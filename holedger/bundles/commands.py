"""Commands for third-party verification: bundles, proofs, witnesses, attestations.

``export`` / ``verify`` (run bundles) are here; ``prove`` / ``verify-proof`` (RFC 9162
inclusion and consistency proofs as text) and ``checkpoint show|cosign|witness-key`` (C2SP
checkpoints and tlog-cosignature witnesses) in proof_commands.py; ``attest`` /
``verify-attestation`` (in-toto Statement v1 in a DSSE envelope) in attest_commands.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from holedger.bundles.attachments import REGISTRY, Attachment
from holedger.bundles.attest_commands import attest_cmd, verify_attestation_cmd
from holedger.bundles.cli_io import (
    WRITE_HINT,
    check_export_note,
    open_ledger,
    output_path,
    read_text,
    tlog_policy,
)
from holedger.bundles.proof_commands import checkpoint_group, prove_cmd, verify_proof_cmd
from holedger.errors import NotFoundError, UsageError
from holedger.ledger.keys import load_trusted_keys
from holedger.output import console, emit_json, progress_bar, settings
from holedger.replay.commands import print_report
from holedger.replay.options import audit_task_option, trusted_key_option, witness_options

if TYPE_CHECKING:
    from holedger.bundles.export import ExportSummary
    from holedger.ledger.store import Ledger


@click.command("export")
@click.argument("run")
@click.option("-o", "--output", "output", required=True, help="The bundle file to write.")
@click.option("--redact", is_flag=True, help="Leave blob bodies out; keep only their digests.")
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    help="A (cosigned) checkpoint note file to carry in the bundle.",
)
@click.option(
    "--baseline-output",
    "baseline_output",
    help="Also write the run's seed-baseline run (where its E(H0) is pinned from) here.",
)
@click.option(
    "--audits",
    "with_audits",
    is_flag=True,
    help="Also carry the run's audits (docs/AUDITS.md); 'verify' then verifies them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.pass_context
def export_cmd(
    ctx: click.Context,
    run: str,
    output: str,
    redact: bool,
    checkpoint_files: tuple[str, ...],
    baseline_output: str | None,
    with_audits: bool,
    as_json: bool,
) -> None:
    """Write RUN as a portable bundle: events as signed, blobs, git history, keys, checkpoints."""

    cfg = settings(ctx)
    notes = [read_text(f, "checkpoint") for f in checkpoint_files]
    if baseline_output is not None and Path(baseline_output).resolve() == Path(output).resolve():
        raise UsageError(
            "--baseline-output names the same file as --output",
            hint="write the baseline run's bundle to a file of its own",
        )
    from holedger.bundles.export import export_bundle  # loaded when run: every command starts

    ledger = open_ledger(ctx)
    written: list[ExportSummary] = []
    exports: list[tuple[str, str, list[str]]] = []
    try:
        run_id = ledger.resolve_run(run)
        for path, note in zip(checkpoint_files, notes, strict=True):
            check_export_note(ledger, run_id, path, note)
        exports.append((run_id, output, notes))
        attached = (
            {"audits": _attachment("audits").make(ledger, cfg, run_id)} if with_audits else {}
        )
        if baseline_output is not None:
            exports.append((_baseline_run_id(ledger, run_id), baseline_output, []))
        for exported, file, carried in exports:
            written.append(
                export_bundle(
                    ledger,
                    exported,
                    output_path(file),
                    redact=redact,
                    repo_path=cfg.run_repo(exported),
                    checkpoints=carried,
                    attachments=attached if exported == run_id else None,
                )
            )
    except OSError as exc:
        failed = exports[len(written)][1] if len(written) < len(exports) else output
        raise UsageError(f"cannot write {failed}: {exc.strerror}", hint=WRITE_HINT) from exc
    finally:
        ledger.close()
    data = [_export_summary(summary) for summary in written]
    if as_json:
        emit_json(data[0] if baseline_output is None else {**data[0], "baseline": data[1]})
        return
    for n, summary in enumerate(written):
        console().print(
            f"wrote {summary.path}: {summary.events} events, {summary.blobs} blobs"
            f"{f', {summary.redacted} redacted' if redact else ''}, "
            f"{summary.git_objects} git objects, {summary.bytes} bytes, sha256 {summary.digest}"
            + (f" (the seed-baseline run {summary.run_id})" if n else "")
        )


def _attachment(name: str) -> Attachment:
    found = REGISTRY.get(name)
    if found is None:
        raise UsageError(f"this holedger cannot carry {name} in a bundle")
    return found


def _export_summary(summary: ExportSummary) -> dict[str, Any]:
    return {
        "path": str(summary.path),
        "run_id": summary.run_id,
        "events": summary.events,
        "blobs": summary.blobs,
        "redacted_blobs": summary.redacted,
        "git_objects": summary.git_objects,
        "checkpoints": summary.checkpoints,
        "bytes": summary.bytes,
        "sha256": summary.digest,
    }


def _baseline_run_id(ledger: Ledger, run_id: str) -> str:
    """The seed-baseline run ``run_id`` pins its E(H0) from; a usage error when none."""
    pinned = ledger.run_terms(run_id).seed_baseline
    if pinned is None or pinned.baseline_run_id is None:
        raise UsageError(
            f"run {run_id} pins no seed-baseline run (a baseline run pins none of its own)",
            hint="leave out --baseline-output",
        )
    if not ledger.has_run(pinned.baseline_run_id):
        raise NotFoundError(
            f"the seed-baseline run {pinned.baseline_run_id} of run {run_id} is not in this ledger",
            hint="export it from the home whose ledger holds it",
        )
    return pinned.baseline_run_id


@click.command("verify")
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@trusted_key_option()
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    help="A checkpoint note published elsewhere; the bundle must contain its tree.",
)
@witness_options("A C2SP tlog-policy file (logs, witnesses, quorum).")
@audit_task_option
@click.option(
    "--baseline",
    "baseline",
    type=click.Path(exists=True, dir_okay=False),
    help="The bundle of the run's seed-baseline run: verified too, and its score compared "
    "with the pinned E(H0).",
)
def verify_cmd(
    bundle: str,
    as_json: bool,
    trusted: tuple[str, ...],
    checkpoint_files: tuple[str, ...],
    policy_file: str | None,
    witnesses: tuple[str, ...],
    quorum: int | None,
    task: str | None,
    baseline: str | None,
) -> None:
    """Verify a run bundle offline: everything 'holedger replay' checks, from the file alone.

    Exit 0 verified, 1 verification failed, 2 bad usage or a malformed bundle.
    """

    from holedger.bundles.verify import verify_bundle  # loaded when run: every command starts

    keys = load_trusted_keys(list(trusted))
    notes = [read_text(f, "checkpoint") for f in checkpoint_files]
    policy = tlog_policy(policy_file, witnesses, quorum)
    with progress_bar("checking events") as progress:
        report = verify_bundle(
            bundle,
            trusted_keys=keys,
            external_checkpoints=notes,
            policy=policy,
            progress=progress,
            task=task,
            baseline=baseline,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
        redacted = report.sections.get("redacted")
        if isinstance(redacted, dict):
            console().print(f"redacted bundle: {redacted.get('blobs')} blob bodies not checked")
    sys.exit(0 if report.verified else 1)


def register(cli: click.Group) -> None:
    """Add the bundle, proof, witness and attestation commands to the `holedger` group."""
    for command in (
        export_cmd,
        verify_cmd,
        prove_cmd,
        verify_proof_cmd,
        checkpoint_group,
        attest_cmd,
        verify_attestation_cmd,
    ):
        cli.add_command(command)
