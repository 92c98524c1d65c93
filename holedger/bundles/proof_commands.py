"""``prove`` / ``verify-proof`` (RFC 9162 inclusion and consistency proofs as text) and
``checkpoint show|cosign|witness-key`` (C2SP checkpoints and tlog-cosignature witnesses)."""

from __future__ import annotations

import base64
import sys
import time
from pathlib import Path
from typing import Any

import click

from holedger.bundles.checks import quorum_text
from holedger.bundles.cli_io import (
    check_export_note,
    load_run,
    open_ledger,
    read_text,
    tlog_policy,
    write_text,
)
from holedger.errors import UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey, SigningKey, load_trusted_keys
from holedger.ledger.note import (
    cosign_checkpoint,
    cosigner_vkey,
    parse_checkpoint,
    parse_note,
    verify_checkpoint,
)
from holedger.ledger.proofs import verify_consistency, verify_inclusion
from holedger.ledger.tlog import TLOG_PROOF_HEADER, TlogProof, parse_tlog_proof
from holedger.output import console, emit_json, plain
from holedger.protocol.runs import origin_of
from holedger.replay.options import trusted_key_option, witness_options
from holedger.replay.report import counted
from holedger.schemas.canonical import b64decode_strict

CONSISTENCY_HEADER = "holedger.dev/consistency-proof@v1"


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
    ledger = open_ledger(ctx)
    try:
        log = load_run(ledger, run)
        size, note = log.checkpoint_size, log.checkpoint_note
        if checkpoint_file is not None:  # a (cosigned) note of one of the run's checkpoints
            note = read_text(checkpoint_file, "checkpoint")
            size = check_export_note(ledger, log.run_id, checkpoint_file, note)
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
            old = parse_checkpoint(parse_note(read_text(from_checkpoint, "checkpoint")).text)
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
            write_text(output, text)
        emit_json({**summary, "output": output, "proof": None if output else text})
    else:
        write_text(output, text)
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
@trusted_key_option(
    "The run's server key (and, to check the event's own signature, its role key).",
    required=True,
)
@click.option(
    "--old-checkpoint", help="For a consistency proof: the earlier checkpoint note to extend."
)
@witness_options("A C2SP tlog-policy file (witness quorum).")
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
    policy = tlog_policy(policy_file, witnesses, quorum)
    text = read_text(proof_file, "proof")
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
            result = _verify_consistency(text, read_text(old_checkpoint, "checkpoint"), keys)
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
    ledger = open_ledger(ctx)
    try:
        log = load_run(ledger, run)
    finally:
        ledger.close()
    if as_json:
        if output:
            write_text(output, log.checkpoint_note)
        emit_json(
            {
                "run_id": log.run_id,
                "size": log.checkpoint_size,
                "root": log.tree.root(log.checkpoint_size).hex(),
                "note": log.checkpoint_note,
            }
        )
    else:
        write_text(output, log.checkpoint_note)


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
    note = read_text(note_file, "checkpoint")
    cp = verify_checkpoint(note, keys).checkpoint
    if previous is not None:
        old = verify_checkpoint(read_text(previous, "checkpoint"), keys).checkpoint
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
            size1, proof, _ = parse_consistency_text(read_text(proof_file, "proof"))
            if size1 != old.size:
                raise VerificationError("the proof does not start at the previous checkpoint")
        verify_consistency(old.size, cp.size, old.root, cp.root, proof)
    ts = int(time.time()) if timestamp is None else timestamp
    cosigned = cosign_checkpoint(note, witness, ts)
    if as_json:
        if output:
            write_text(output, cosigned)
        emit_json(
            {
                "witness": cosigner_vkey(witness.public),
                "time": ts,
                "size": cp.size,
                "note": None if output else cosigned,
            }
        )
    else:
        write_text(output, cosigned)
