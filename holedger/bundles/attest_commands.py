"""``attest`` / ``verify-attestation``: a run's result as an in-toto Statement v1 in a DSSE
envelope, signed by the operator key, and its check."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from holedger.bundles.cli_io import load_run, open_ledger, read_text, write_text
from holedger.errors import CanonicalError, NotFoundError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey, load_trusted_keys
from holedger.ledger.note import parse_checkpoint, parse_note
from holedger.output import console, emit_json, plain, progress_bar, settings
from holedger.replay.options import trusted_key_option
from holedger.replay.report import score_text
from holedger.schemas.canonical import parse_json


def _file_sha256(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError as exc:
        raise NotFoundError(f"no file at {path}", hint="check the file name") from exc


def run_result(
    run_id: str, records: list[bytes], checkpoint_note: str, report: Any
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The subjects and the run-result/v1 predicate of a run (docs/FORMAT.md)."""
    opened: dict[str, Any] = {}
    scored: dict[str, Any] | None = None
    nominated: str | None = None
    for raw in records:
        rec = parse_record(raw)
        if rec.type == "RunOpened":
            opened = rec.payload
        elif rec.type == "RunScored":
            scored = rec.payload
        elif rec.type == "CandidateNominated":
            nominated = str(rec.payload.get("candidate"))
    cp = parse_checkpoint(parse_note(checkpoint_note).text)
    budget = report.sections.get("budget_table") if report is not None else None
    predicate: dict[str, Any] = {
        "run_id": run_id,
        "task_id": opened.get("task_id"),
        "task_digest": opened.get("task_digest"),
        "optimizer": opened.get("optimizer"),
        "candidate": (scored or {}).get("candidate", nominated),
        "k": (scored or {}).get("k"),
        "e_h_plus": (scored or {}).get("e_h_plus"),
        "e_h0": (scored or {}).get("e_h0"),
        "g": (scored or {}).get("g"),
        "budget_use": budget,
        "verdict": "verified" if report.verified else "failed",
        # A verified log of an abandoned run: no score, and the statement says so.
        "aborted": bool(report is not None and report.aborted),
        "failed_checks": report.failed_checks(),
        "warnings": [c.name for c in report.checks if c.level == "warning" and not c.ok],
        "events": len(records),
        "checkpoint": {"origin": cp.origin, "size": cp.size, "root": cp.root.hex()},
        "keys": {
            role: f"{info['name']}+{info['key_id']}"
            for role, info in opened.get("keys", {}).items()
        },
    }
    subjects = [(f"{cp.origin}/checkpoint/{cp.size}", cp.root.hex())]
    return subjects, predicate


@click.command("attest")
@click.argument("run")
@click.option("-o", "--output", "output", required=True, help="The .intoto.json file to write.")
@click.option("--bundle", "bundle_file", help="Also name this exported bundle as a subject.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.pass_context
def attest_cmd(
    ctx: click.Context, run: str, output: str, bundle_file: str | None, as_json: bool
) -> None:
    """Sign RUN's result as an in-toto Statement v1 (DSSE, Ed25519, operator key)."""

    from holedger.ledger.attest import attest
    from holedger.replay.runs import replay_run

    cfg = settings(ctx)
    key = SigningKey.load(cfg.key_path)
    ledger = open_ledger(ctx)
    try:
        run_id = ledger.resolve_run(run)
        with progress_bar("checking events") as progress:
            # Pinned to the key that signs the attestation: "verified" then means under
            # this operator's key, not under whatever keys the run declares.
            report = replay_run(ledger, run_id, trusted_keys=[key.public], progress=progress)
        log = load_run(ledger, run_id)
    finally:
        ledger.close()
    subjects, predicate = run_result(log.run_id, log.records, log.checkpoint_note, report)
    if bundle_file:
        subjects.append((Path(bundle_file).name, _file_sha256(bundle_file)))
    envelope = attest(subjects, predicate, key)
    write_text(output, json.dumps(envelope, indent=2) + "\n")
    if as_json:
        emit_json({"path": output, "subjects": subjects, "verdict": predicate["verdict"]})
    else:
        console().print(
            f"wrote {output}: verdict {predicate['verdict']}, signed by {key.public.vkey()}"
        )


def _looks_like_envelope(text: str) -> bool:
    """Whether ``text`` is shaped as a DSSE envelope at all (its content is verified
    later): telling a wrong file (bad usage) from a forged or damaged envelope."""
    try:
        value = parse_json(text.encode("utf-8"))  # bounded depth; an envelope has no floats
    except CanonicalError:
        return False
    return isinstance(value, dict) and {"payloadType", "payload", "signatures"} <= set(value)


@click.command("verify-attestation")
@click.argument("attestation")
@trusted_key_option("Signer vkey(s).", required=True)
@click.option("--bundle", "bundle_file", help="Check that this bundle is a subject.")
@click.option("--json", "as_json", is_flag=True, help="Print the statement as JSON.")
def verify_attestation_cmd(
    attestation: str, trusted: tuple[str, ...], bundle_file: str | None, as_json: bool
) -> None:
    """Verify a result attestation's DSSE signature and print its statement.

    Exit 0 when the signature verifies and the attested run's verdict is "verified"; 1
    when the signature (or the bundle subject) fails, or the attestation says its run
    failed replay; 2 bad usage.
    """
    from holedger.ledger.attest import verify_attestation

    keys = load_trusted_keys(list(trusted))
    text = read_text(attestation, "attestation")
    if not _looks_like_envelope(text):
        raise UsageError(
            f"{attestation} is not a DSSE envelope (a JSON object with payloadType, payload "
            "and signatures)",
            hint="make one with 'holedger attest RUN -o FILE'",
        )
    try:
        statement = verify_attestation(text, keys)
        if bundle_file:
            digest = _file_sha256(bundle_file)
            if not any(s["digest"].get("sha256") == digest for s in statement["subject"]):
                raise VerificationError("the bundle is not a subject of the attestation")
        found = statement.get("predicate")
        pred: dict[str, Any] = found if isinstance(found, dict) else {}
        # A valid signature on "this run failed" is no passing result: the exit status
        # says whether the attested run verified, so a script checking it alone is safe.
        run_ok = pred.get("verdict") == "verified"
        result: dict[str, Any] = {
            "verified": True,
            "run_verified": run_ok,
            "statement": statement,
        }
    except VerificationError as exc:
        result = {"verified": False, "run_verified": False, "reason": exc.message}
    if as_json:
        emit_json(result)
    elif result["run_verified"]:
        if pred.get("aborted") is True:
            console().print(
                f"[bold yellow]VERIFIED (aborted)[/] run {plain(pred.get('run_id'))}: "
                "the run was closed as aborted and has no score"
            )
        else:
            console().print(
                f"[bold green]VERIFIED[/] run {plain(pred.get('run_id'))}: verdict "
                f"{plain(pred.get('verdict'))}, g {plain(score_text(pred.get('g')))}"
            )
    elif result["verified"]:
        failed = pred.get("failed_checks")
        checks = ", ".join(str(c) for c in failed) if isinstance(failed, list) else "?"
        console().print(
            f"[bold red]RUN FAILED[/] the signature verifies, but it attests that run "
            f"{plain(pred.get('run_id', '?'))} did not verify (verdict "
            f"{plain(pred.get('verdict', '?'))}; failed checks: {plain(checks)})"
        )
    else:
        console().print(f"[bold red]FAILED[/] {plain(result['reason'])}")
    sys.exit(0 if result["run_verified"] else 1)
