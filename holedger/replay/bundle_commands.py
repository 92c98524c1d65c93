"""Commands for third-party verification: bundles, proofs, witnesses, attestations.

``export`` / ``verify`` (run bundles), ``prove`` / ``verify-proof`` (RFC 9162 inclusion
and consistency proofs as text), ``checkpoint show|cosign|witness-key`` (C2SP
checkpoints and tlog-cosignature witnesses), ``attest`` / ``verify-attestation``
(in-toto Statement v1 in a DSSE envelope).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from holedger.errors import CanonicalError, NotFoundError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey, SigningKey, load_trusted_keys, vkey_texts
from holedger.ledger.note import (
    TLOG_PROOF_HEADER,
    TlogPolicy,
    TlogProof,
    WitnessGroup,
    cosign_checkpoint,
    cosigner_vkey,
    parse_checkpoint,
    parse_note,
    parse_policy,
    parse_tlog_proof,
    parse_vkey,
    verify_checkpoint,
)
from holedger.ledger.proofs import MerkleTree, verify_consistency, verify_inclusion
from holedger.output import console, emit_json, plain, progress_bar, settings
from holedger.protocol.runs import origin_of
from holedger.replay.commands import trusted_key_option
from holedger.replay.report import counted, score_text
from holedger.schemas.canonical import b64decode_strict, parse_json

if TYPE_CHECKING:
    from holedger.ledger.store import Ledger
    from holedger.replay.bundle import ExportSummary

CONSISTENCY_HEADER = "holedger.dev/consistency-proof@v1"
MAX_INPUT_FILE = 8 << 20


# ------------------------------------------------------------------------ helpers


def _read_text(path: str, what: str) -> str:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_INPUT_FILE:
            raise UsageError(f"{what} file {path} is too large")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise NotFoundError(f"no {what} file at {path}", hint="check the file name") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} file {path} is not UTF-8 text",
            hint=f"give the {what} file itself (a text file), not a bundle or another file",
        ) from exc
    except OSError as exc:
        raise UsageError(f"cannot read {what} file {path}: {exc.strerror}") from exc


def _write_text(path: str | None, text: str) -> None:
    if path is None or path == "-":
        click.echo(text, nl=False)
        return
    out = _output_path(path)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", hint=_WRITE_HINT) from exc


_WRITE_HINT = "give -o a file path you may write"


def _output_path(path: str) -> Path:
    """``path``, its folder made if missing (as ``report -o`` does), or a one-line error."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot make the folder of {path}: {exc.strerror}", hint=_WRITE_HINT
        ) from exc
    if out.is_dir():
        raise UsageError(f"{path} is a folder", hint=_WRITE_HINT)
    return out


def _witness_vkeys(values: tuple[str, ...]) -> list[str]:
    """The witness vkeys of ``--witness`` values: a vkey, or a file of them (as
    ``--trusted-key`` takes)."""
    hint = "give a witness vkey as printed by 'holedger checkpoint witness-key', or a file of them"
    return vkey_texts(values, what="witness vkey", file_word="witness key file", hint=hint)


def _policy(policy_file: str | None, witnesses: tuple[str, ...], quorum: int | None) -> Any:
    if policy_file and witnesses:
        raise UsageError("give either --policy or --witness, not both")
    if policy_file:
        return parse_policy(_read_text(policy_file, "policy"))
    if not witnesses:
        if quorum is not None:
            raise UsageError(
                "--quorum needs --witness keys",
                hint="name each witness with --witness VKEY (from 'checkpoint witness-key')",
            )
        return None
    policy = TlogPolicy()
    seen: set[bytes] = set()
    for i, text in enumerate(_witness_vkeys(witnesses), start=1):
        key = parse_vkey(text).key
        if key.raw in seen:
            raise UsageError(
                f"--witness number {i} repeats a key given before",
                hint="give each witness's key once; --quorum counts distinct witnesses",
            )
        seen.add(key.raw)
        policy.witnesses[f"w{i}"] = key
    given = len(policy.witnesses)
    need = given if quorum is None else quorum
    if not 1 <= need <= given:
        raise UsageError(
            f"--quorum must be between 1 and {given} (the witnesses given)",
            hint="give as many --witness keys as the quorum needs, or a smaller --quorum",
        )
    policy.groups["witnesses"] = WitnessGroup("witnesses", need, tuple(policy.witnesses))
    policy.quorum = "witnesses"
    return policy


def _open_ledger(ctx: click.Context) -> Any:
    from holedger.ledger.store import Ledger

    cfg = settings(ctx)
    return Ledger.open(cfg.ledger_url, None, create_tables=False)


@dataclass
class _RunLog:
    run_id: str
    tree: MerkleTree
    records: list[bytes]
    checkpoint_size: int
    checkpoint_note: str


def _load_run(ledger: Any, run: str) -> _RunLog:
    run_id = ledger.resolve_run(run)
    records: list[bytes] = []
    tree = MerkleTree([])
    size, note = -1, ""
    for _, raw in ledger.raw_records(run_id):
        rec = parse_record(raw)
        if rec.type == "Checkpoint":
            size, note = int(rec.payload["size"]), str(rec.payload["note"])
        tree.append(rec.leaf_hash)
        records.append(raw)
    if size < 0:
        raise NotFoundError(f"run {run_id} has no checkpoint yet", hint="append more events")
    return _RunLog(run_id, tree, records, size, note)


# ---------------------------------------------------------------- export / verify


def _check_export_note(ledger: Any, run_id: str, path: str, note: str) -> int:
    """A note carried in a bundle (or a proof) must be one of the run's own checkpoints,
    signed by its server key (witness cosignatures are checked by the verifier, against its
    policy): refused here, before anything is written, rather than found broken by every
    verifier. Returns the note's tree size."""
    info = ledger.run_terms(run_id).keys.get("server")
    server = None if info is None else PublicKey.declared(info.name, info.public_key)
    roots = {
        int(rec.payload["size"]): str(rec.payload["root"])
        for rec in ledger.records(run_id)
        if rec.type == "Checkpoint"
    }
    hint = f"give a note made by 'holedger checkpoint show {run_id}' (cosigned or not)"
    try:
        cp = verify_checkpoint(
            note, [server] if server else [], origin=origin_of(run_id)
        ).checkpoint
    except VerificationError as exc:
        raise UsageError(f"checkpoint note {path}: {exc.message}", hint=hint) from exc
    if roots.get(cp.size) != cp.root.hex():
        raise UsageError(
            f"checkpoint note {path} (size {cp.size}) is not a checkpoint of run {run_id}",
            hint=hint,
        )
    return cp.size


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
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.pass_context
def export_cmd(
    ctx: click.Context,
    run: str,
    output: str,
    redact: bool,
    checkpoint_files: tuple[str, ...],
    baseline_output: str | None,
    as_json: bool,
) -> None:
    """Write RUN as a portable bundle: events as signed, blobs, git history, keys, checkpoints."""
    from holedger.replay.bundle import export_bundle

    cfg = settings(ctx)
    notes = [_read_text(f, "checkpoint") for f in checkpoint_files]
    if baseline_output is not None and Path(baseline_output).resolve() == Path(output).resolve():
        raise UsageError(
            "--baseline-output names the same file as --output",
            hint="write the baseline run's bundle to a file of its own",
        )
    ledger = _open_ledger(ctx)
    written: list[ExportSummary] = []
    exports: list[tuple[str, str, list[str]]] = []
    try:
        run_id = ledger.resolve_run(run)
        for path, note in zip(checkpoint_files, notes, strict=True):
            _check_export_note(ledger, run_id, path, note)
        exports.append((run_id, output, notes))
        if baseline_output is not None:
            exports.append((_baseline_run_id(ledger, run_id), baseline_output, []))
        for exported, file, carried in exports:
            written.append(
                export_bundle(
                    ledger,
                    exported,
                    _output_path(file),
                    redact=redact,
                    repo_path=cfg.run_repo(exported),
                    checkpoints=carried,
                )
            )
    except OSError as exc:
        failed = exports[len(written)][1] if len(written) < len(exports) else output
        raise UsageError(f"cannot write {failed}: {exc.strerror}", hint=_WRITE_HINT) from exc
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
@trusted_key_option
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    help="A checkpoint note published elsewhere; the bundle must contain its tree.",
)
@click.option("--policy", "policy_file", help="A C2SP tlog-policy file (logs, witnesses, quorum).")
@click.option(
    "--witness",
    "witnesses",
    multiple=True,
    help="A witness cosigner vkey (0x04), or a file of them; repeatable.",
)
@click.option("--quorum", type=int, help="How many --witness cosignatures are needed.")
@click.option(
    "--task",
    "task",
    default=None,
    help="A task name or folder for the leakage audit (default: the task the run names).",
)
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
    from holedger.replay.bundle import verify_bundle
    from holedger.replay.commands import print_report

    keys = load_trusted_keys(list(trusted))
    notes = [_read_text(f, "checkpoint") for f in checkpoint_files]
    policy = _policy(policy_file, witnesses, quorum)
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


# -------------------------------------------------------------------- proofs


def consistency_text(size1: int, proof: list[bytes], checkpoint_note: str) -> str:
    lines = [CONSISTENCY_HEADER, f"old {size1}"]
    lines += [base64.b64encode(h).decode() for h in proof]
    return "\n".join(lines) + "\n\n" + checkpoint_note


def parse_consistency_text(text: str) -> tuple[int, list[bytes], str]:
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or lines[0] != CONSISTENCY_HEADER or len(lines) < 2:
        raise VerificationError("not a holedger consistency proof")
    if not lines[1].startswith("old ") or not lines[1][4:].isdigit():
        raise VerificationError("consistency proof has no 'old <size>' line")
    if len(lines) > 2 + 65:
        raise VerificationError("consistency proof has too many hashes")
    proof: list[bytes] = []
    for line in lines[2:]:
        hash_ = b64decode_strict(line)
        if hash_ is None:
            raise VerificationError("consistency proof hash is not base64")
        proof.append(hash_)
    return int(lines[1][4:]), proof, note


@click.command("prove")
@click.argument("run")
@click.option("--seq", type=int, help="Prove that event SEQ is in the run's latest checkpoint.")
@click.option(
    "--from-checkpoint",
    "from_checkpoint",
    help="Prove the latest checkpoint extends this earlier checkpoint note (consistency).",
)
@click.option(
    "--from-size",
    type=int,
    help="Like --from-checkpoint, from a tree size (a verifier then needs a checkpoint "
    "note of that size, kept from when the log had it).",
)
@click.option(
    "--checkpoint",
    "checkpoint_file",
    help="Prove against this checkpoint note of the run (e.g. one witnesses cosigned) "
    "instead of the latest.",
)
@click.option("-o", "--output", "output", help="Write the proof here (default: stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (and the proof).")
@click.pass_context
def prove_cmd(
    ctx: click.Context,
    run: str,
    seq: int | None,
    from_checkpoint: str | None,
    from_size: int | None,
    checkpoint_file: str | None,
    output: str | None,
    as_json: bool,
) -> None:
    """An RFC 9162 inclusion proof (C2SP tlog-proof text) or a consistency proof for RUN."""
    if sum(x is not None for x in (seq, from_checkpoint, from_size)) != 1:
        raise UsageError("give exactly one of --seq, --from-checkpoint, --from-size")
    ledger = _open_ledger(ctx)
    try:
        log = _load_run(ledger, run)
        size, note = log.checkpoint_size, log.checkpoint_note
        if checkpoint_file is not None:  # a (cosigned) note of one of the run's checkpoints
            note = _read_text(checkpoint_file, "checkpoint")
            size = _check_export_note(ledger, log.run_id, checkpoint_file, note)
    finally:
        ledger.close()
    which = "the latest checkpoint" if checkpoint_file is None else "that checkpoint"
    if seq is not None:
        if not 0 <= seq < size:
            raise UsageError(
                f"event {seq} is not covered by {which} (size {size})",
                hint=f"choose a seq from 0 to {size - 1}",
            )
        proof_hashes = log.tree.inclusion_proof(seq, size)
        text = TlogProof(seq, tuple(proof_hashes), note, log.records[seq]).render()
        kind = "inclusion"
        summary: dict[str, Any] = {"kind": kind, "seq": seq}
    else:
        if from_checkpoint is not None:
            old = parse_checkpoint(parse_note(_read_text(from_checkpoint, "checkpoint")).text)
            size1 = old.size
        else:
            assert from_size is not None
            size1 = from_size
        if not 0 < size1 <= size:
            raise UsageError(f"no consistency proof from size {size1} to size {size}")
        proof_hashes = log.tree.consistency_proof(size1, size)
        text = consistency_text(size1, proof_hashes, note)
        summary = {"kind": "consistency", "old_size": size1}
    summary.update({"run_id": log.run_id, "tree_size": size, "hashes": len(proof_hashes)})
    if as_json:
        if output:
            _write_text(output, text)
        emit_json({**summary, "output": output, "proof": None if output else text})
    else:
        _write_text(output, text)
        if output:
            what = (
                f"inclusion proof of seq {seq}"
                if seq is not None
                else f"consistency proof from size {summary['old_size']}"
            )
            console().print(
                f"wrote {plain(output)}: {what} to tree size {size} "
                f"({counted(len(proof_hashes), 'hash', 'hashes')})",
                soft_wrap=True,
            )


@click.command("verify-proof")
@click.argument("proof_file")
@click.option(
    "--trusted-key",
    "trusted",
    multiple=True,
    required=True,
    help="The run's server key (and, to check the event's own signature, its role key).",
)
@click.option(
    "--old-checkpoint", help="For a consistency proof: the earlier checkpoint note to extend."
)
@click.option("--policy", "policy_file", help="A C2SP tlog-policy file (witness quorum).")
@click.option(
    "--witness",
    "witnesses",
    multiple=True,
    help="A witness cosigner vkey (0x04), or a file of them; repeatable.",
)
@click.option("--quorum", type=int, help="How many --witness cosignatures are needed.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify_proof_cmd(
    proof_file: str,
    trusted: tuple[str, ...],
    old_checkpoint: str | None,
    policy_file: str | None,
    witnesses: tuple[str, ...],
    quorum: int | None,
    as_json: bool,
) -> None:
    """Check an inclusion (tlog-proof) or consistency proof against trusted keys.

    Exit 0 verified, 1 verification failed, 2 bad usage.
    """
    keys = load_trusted_keys(list(trusted))
    policy = _policy(policy_file, witnesses, quorum)
    text = _read_text(proof_file, "proof")
    if not text.startswith((CONSISTENCY_HEADER + "\n", TLOG_PROOF_HEADER + "\n")):
        raise UsageError(
            f"{proof_file} is not a proof: its first line is neither {TLOG_PROOF_HEADER} nor "
            f"{CONSISTENCY_HEADER}",
            hint="make one with 'holedger prove RUN --seq N' (or --from-size N)",
        )
    try:
        if text.startswith(CONSISTENCY_HEADER):
            if old_checkpoint is None:
                raise UsageError(
                    "a consistency proof needs --old-checkpoint",
                    hint="give the checkpoint note kept from when the log was smaller "
                    "(what 'holedger checkpoint show RUN' printed then)",
                )
            result = _verify_consistency(text, _read_text(old_checkpoint, "checkpoint"), keys)
        else:
            result = _verify_inclusion(text, keys)
        result.update(_witness_result(result.pop("note"), keys, policy))
        if "witnesses" in result:
            cosigners = ", ".join(result["witnesses"]) or "none needed"
            result["summary"] += f"; witness quorum met (cosigned by {cosigners})"
        result["verified"] = True
    except VerificationError as exc:
        result = {"verified": False, "reason": exc.message}
    if as_json:
        emit_json(result)
    elif result["verified"]:
        console().print(f"[bold green]VERIFIED[/] {plain(result['summary'])}")
    else:
        console().print(f"[bold red]FAILED[/] {plain(result['reason'])}")
    sys.exit(0 if result["verified"] else 1)


def _witness_result(note: str, keys: list[PublicKey], policy: Any) -> dict[str, Any]:
    if policy is None:
        return {}
    log_keys = policy.logs or keys
    v = verify_checkpoint(note, log_keys, witnesses=list(policy.witnesses.values()))
    names = policy.witness_names_for(v.cosigners)
    if not policy.satisfied(names):
        from holedger.replay.bundle import quorum_text

        raise VerificationError(
            f"the proof's checkpoint cosignatures ({len(v.witnesses)}) do not meet the witness "
            f"quorum ({quorum_text(policy)}); prove against a cosigned note: 'holedger prove "
            "RUN --checkpoint COSIGNED_NOTE'"
        )
    return {"witnesses": sorted(v.witnesses)}


def _verify_inclusion(text: str, keys: list[PublicKey]) -> dict[str, Any]:
    proof = parse_tlog_proof(text)
    cp = verify_checkpoint(proof.checkpoint, keys)
    if proof.extra is None:
        raise VerificationError("the proof carries no event record (extra line)")
    rec = parse_record(proof.extra)
    if cp.checkpoint.origin != origin_of(rec.run_id):
        raise VerificationError("the event belongs to another run than the checkpoint")
    if rec.seq != proof.index:
        raise VerificationError(f"the event's seq {rec.seq} is not the proof index")
    verify_inclusion(
        rec.leaf_hash, proof.index, cp.checkpoint.size, list(proof.hashes), cp.checkpoint.root
    )
    signer = next((k for k in keys if k.key_id_hex == rec.key_id), None)
    if signer is not None and not rec.verify_signature(signer):
        raise VerificationError("the event's own signature does not verify")
    return {
        "kind": "inclusion",
        "run_id": rec.run_id,
        "seq": rec.seq,
        "type": rec.type,
        "tree_size": cp.checkpoint.size,
        "event_signature": "verified" if signer else "not checked (no trusted key for it)",
        "log_key": cp.log_key,
        "note": proof.checkpoint,
        "summary": f"event {rec.seq} ({rec.type}) of run {rec.run_id} is in the checkpoint "
        f"of size {cp.checkpoint.size}",
    }


def _verify_consistency(text: str, old_note: str, keys: list[PublicKey]) -> dict[str, Any]:
    size1, proof, note = parse_consistency_text(text)
    new = verify_checkpoint(note, keys).checkpoint
    old = verify_checkpoint(old_note, keys).checkpoint
    if old.origin != new.origin:
        raise VerificationError("the two checkpoints are of different logs")
    if old.size != size1:
        raise VerificationError(
            f"the proof starts at size {size1}, the old checkpoint is {old.size}"
        )
    verify_consistency(old.size, new.size, old.root, new.root, proof)
    return {
        "kind": "consistency",
        "origin": new.origin,
        "old_size": old.size,
        "new_size": new.size,
        "note": note,
        "summary": f"checkpoint of size {new.size} extends the one of size {old.size}",
    }


# ---------------------------------------------------------------- checkpoints


@click.group("checkpoint")
def checkpoint_group() -> None:
    """Signed checkpoints (C2SP tlog-checkpoint) and witness cosignatures."""


@checkpoint_group.command("show")
@click.argument("run")
@click.option("-o", "--output", "output", help="Write the note here (default: stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print size, root and note as JSON.")
@click.pass_context
def checkpoint_show_cmd(ctx: click.Context, run: str, output: str | None, as_json: bool) -> None:
    """The latest signed checkpoint note of RUN (to publish, or to send to a witness)."""
    ledger = _open_ledger(ctx)
    try:
        log = _load_run(ledger, run)
    finally:
        ledger.close()
    if as_json:
        if output:
            _write_text(output, log.checkpoint_note)
        emit_json(
            {
                "run_id": log.run_id,
                "size": log.checkpoint_size,
                "root": log.tree.root(log.checkpoint_size).hex(),
                "note": log.checkpoint_note,
            }
        )
    else:
        _write_text(output, log.checkpoint_note)


@checkpoint_group.command("witness-key")
@click.argument("name")
@click.option("-o", "--output", "output", required=True, help="The private key file to create.")
@click.option("--json", "as_json", is_flag=True, help="Print the verifier key as JSON.")
def witness_key_cmd(name: str, output: str, as_json: bool) -> None:
    """Create a witness key; prints its cosignature verifier key (type 0x04)."""
    key = SigningKey.generate(name)
    key.save(Path(output))
    vkey = cosigner_vkey(key.public)
    if as_json:
        emit_json({"name": name, "key_file": output, "vkey": vkey})
    else:
        click.echo(vkey)


@checkpoint_group.command("cosign")
@click.argument("note_file")
@click.option("--key", "key_file", required=True, help="The witness's private key file.")
@click.option(
    "--log-key",
    "log_keys",
    multiple=True,
    required=True,
    help="The log's (server's) verifier key: the witness checks the signature first.",
)
@click.option("--previous", help="The checkpoint this witness cosigned before, for this log.")
@click.option("--proof", "proof_file", help="Consistency proof from --previous to this note.")
@click.option("--time", "timestamp", type=int, help="Cosignature time (default: now).")
@click.option("-o", "--output", "output", help="Write the cosigned note here (default: stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def cosign_cmd(
    note_file: str,
    key_file: str,
    log_keys: tuple[str, ...],
    previous: str | None,
    proof_file: str | None,
    timestamp: int | None,
    output: str | None,
    as_json: bool,
) -> None:
    """Add a C2SP tlog-cosignature (cosignature/v1) by a witness key to a checkpoint note.

    The witness first verifies the log's signature, and with --previous/--proof that the
    new checkpoint extends the one it cosigned before.
    """
    keys = load_trusted_keys(list(log_keys))
    witness = SigningKey.load(Path(key_file))
    note = _read_text(note_file, "checkpoint")
    cp = verify_checkpoint(note, keys).checkpoint
    if previous is not None:
        old = verify_checkpoint(_read_text(previous, "checkpoint"), keys).checkpoint
        if old.origin != cp.origin:
            raise VerificationError("the previous checkpoint is of another log")
        if old.size > cp.size:
            raise VerificationError("the new checkpoint is smaller than the previous one")
        proof: list[bytes] = []
        if old.size != cp.size:
            if proof_file is None:
                raise UsageError(
                    "--previous needs --proof (from 'holedger prove --from-checkpoint')"
                )
            size1, proof, _ = parse_consistency_text(_read_text(proof_file, "proof"))
            if size1 != old.size:
                raise VerificationError("the proof does not start at the previous checkpoint")
        verify_consistency(old.size, cp.size, old.root, cp.root, proof)
    ts = int(time.time()) if timestamp is None else timestamp
    cosigned = cosign_checkpoint(note, witness, ts)
    if as_json:
        if output:
            _write_text(output, cosigned)
        emit_json(
            {
                "witness": cosigner_vkey(witness.public),
                "time": ts,
                "size": cp.size,
                "note": None if output else cosigned,
            }
        )
    else:
        _write_text(output, cosigned)


# ---------------------------------------------------------------- attestations


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
    ledger = _open_ledger(ctx)
    try:
        run_id = ledger.resolve_run(run)
        with progress_bar("checking events") as progress:
            # Pinned to the key that signs the attestation: "verified" then means under
            # this operator's key, not under whatever keys the run declares.
            report = replay_run(ledger, run_id, trusted_keys=[key.public], progress=progress)
        log = _load_run(ledger, run_id)
    finally:
        ledger.close()
    subjects, predicate = run_result(log.run_id, log.records, log.checkpoint_note, report)
    if bundle_file:
        subjects.append((Path(bundle_file).name, _file_sha256(bundle_file)))
    envelope = attest(subjects, predicate, key)
    _write_text(output, json.dumps(envelope, indent=2) + "\n")
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
@click.option("--trusted-key", "trusted", multiple=True, required=True, help="Signer vkey(s).")
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
    text = _read_text(attestation, "attestation")
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
