"""What the bundle, proof, witness and attestation commands share: the files they are
given (read with a size limit, as UTF-8) and write, a witness policy from options, and a
run's log and latest checkpoint, and a checkpoint note given for a run checked against
the run's own checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from holedger.errors import NotFoundError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey, vkey_texts
from holedger.ledger.note import parse_vkey, verify_checkpoint
from holedger.ledger.proofs import MerkleTree
from holedger.ledger.tlog import TlogPolicy, WitnessGroup, parse_policy
from holedger.output import settings
from holedger.protocol.runs import origin_of

MAX_INPUT_FILE = 8 << 20


def read_text(path: str, what: str) -> str:
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


def write_text(path: str | None, text: str) -> None:
    if path is None or path == "-":
        click.echo(text, nl=False)
        return
    out = output_path(path)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", hint=WRITE_HINT) from exc


WRITE_HINT = "give -o a file path you may write"


def output_path(path: str) -> Path:
    """``path``, its folder made if missing (as ``report -o`` does), or a one-line error."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot make the folder of {path}: {exc.strerror}", hint=WRITE_HINT
        ) from exc
    if out.is_dir():
        raise UsageError(f"{path} is a folder", hint=WRITE_HINT)
    return out


def witness_vkeys(values: tuple[str, ...]) -> list[str]:
    """The witness vkeys of ``--witness`` values: a vkey, or a file of them (as
    ``--trusted-key`` takes)."""
    hint = "give a witness vkey as printed by 'holedger checkpoint witness-key', or a file of them"
    return vkey_texts(values, what="witness vkey", file_word="witness key file", hint=hint)


def tlog_policy(policy_file: str | None, witnesses: tuple[str, ...], quorum: int | None) -> Any:
    if policy_file and witnesses:
        raise UsageError("give either --policy or --witness, not both")
    if policy_file:
        return parse_policy(read_text(policy_file, "policy"))
    if not witnesses:
        if quorum is not None:
            raise UsageError(
                "--quorum needs --witness keys",
                hint="name each witness with --witness VKEY (from 'checkpoint witness-key')",
            )
        return None
    policy = TlogPolicy()
    seen: set[bytes] = set()
    for i, text in enumerate(witness_vkeys(witnesses), start=1):
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


def open_ledger(ctx: click.Context) -> Any:
    from holedger.ledger.store import Ledger

    cfg = settings(ctx)
    return Ledger.open(cfg.ledger_url, None, create_tables=False)


@dataclass
class RunLog:
    run_id: str
    tree: MerkleTree
    records: list[bytes]
    checkpoint_size: int
    checkpoint_note: str


def load_run(ledger: Any, run: str) -> RunLog:
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
    return RunLog(run_id, tree, records, size, note)


def check_export_note(ledger: Any, run_id: str, path: str, note: str) -> int:
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
