"""An audits bundle: a run's audits, portable, verifiable without the ledger they came from.

``holedger audit export RUN -o FILE`` writes one file (JSON Lines, format
``holedger-audits`` version 1): a header naming the run and its audits, then every record
of each audit, every record of the audited run, of the control runs its audits name and of
the run's pinned seed-baseline run, each as the exact stored bytes (base64), and every
blob those records name that the ledger holds. ``holedger audit verify --bundle FILE``
verifies each audit from the file alone, with the checks of ``audit verify``: the runs
replay from their bundled records, and every number is recomputed from them. The
detector findings and the strata also need the task and the candidates' code, which the
file does not carry: they are reported as skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from holedger.audit.facts import read_run
from holedger.audit.hda import read_audit
from holedger.audit.log import AuditLog
from holedger.config import Settings
from holedger.errors import NotFoundError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey
from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport

FORMAT = "holedger-audits"
VERSION = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _digests(payload: Any) -> Iterator[str]:
    """Every ``*_digest`` value of a payload, nested members included."""
    if isinstance(payload, dict):
        for key, value in payload.items():
            if key.endswith("_digest") and isinstance(value, str):
                yield value
            else:
                yield from _digests(value)
    elif isinstance(payload, list):
        for value in payload:
            yield from _digests(value)


def audits_bytes(ledger: Ledger, run_ref: str) -> tuple[bytes, dict[str, Any]]:
    """The run's audits (every audit bound to it) with what verifying them needs, as the
    bytes of an audits bundle, and a summary."""
    run_id = ledger.resolve_run(run_ref)
    log = AuditLog(ledger.app.engine)
    audits = [a for a in log.audit_ids() if read_audit(log, a).opened.run_id == run_id]
    if not audits:
        raise NotFoundError(f"run {run_id} has no audit", hint="see 'holedger audit list'")
    runs = [run_id]
    baseline = read_run(run_id, ledger.records(run_id)).baseline_run
    if baseline is not None and ledger.has_run(baseline):
        runs.append(baseline)
    for audit_id in audits:
        state = read_audit(log, audit_id)
        named = [c.control_run_id for c in state.controls]
        named += [state.neutral.control_run_id] if state.neutral else []
        for rid in named:
            if rid not in runs and ledger.has_run(rid):
                runs.append(rid)
    lines: list[dict[str, Any]] = [
        {"format": FORMAT, "version": VERSION, "run_id": run_id, "audits": audits}
    ]
    digests: list[str] = []
    for rid in runs:
        for seq, raw in ledger.raw_records(rid):
            lines.append({"run": rid, "seq": seq, "record": _b64(raw)})
            digests += _digests(parse_record(raw).payload)
    for audit_id in audits:
        lines += [{"audit": audit_id, "record": _b64(r.raw)} for r in log.records(audit_id)]
    blobs = sorted({d for d in digests if ledger.has_blob(d)})
    lines += [{"blob": d, "data": _b64(ledger.get_blob(d))} for d in blobs]
    data = "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
    summary = {"run_id": run_id, "audits": audits, "runs": runs, "blobs": len(blobs)}
    return data.encode("utf-8"), summary


def export_audits(ledger: Ledger, run_ref: str, out: Path) -> dict[str, Any]:
    """Write the run's audits bundle to ``out``, whole or not at all."""
    data, summary = audits_bytes(ledger, run_ref)
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(data)
    partial.replace(out)
    return {**summary, "file": str(out)}


@dataclass
class BundledRuns:
    """The runs and blobs of an audits bundle, read as a ledger is read by an audit."""

    run_id: str
    audits: list[str]
    raw: dict[str, list[bytes]] = field(default_factory=dict)
    audit_raw: dict[str, list[bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def has_run(self, run_id: str) -> bool:
        return run_id in self.raw

    def records(self, run_id: str, after_seq: int = -1) -> Iterator[Record]:
        for raw in self.raw.get(run_id, [])[after_seq + 1 :]:
            yield parse_record(raw)

    def get_blob(self, digest: str) -> bytes:
        if digest not in self.blobs:
            raise NotFoundError(f"blob {digest[:12]} is not in the bundle")
        return self.blobs[digest]

    def blob(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)

    def redacted(self, digest: str) -> bool:
        return False

    def replay_report(self, run_id: str, trusted: Sequence[PublicKey]) -> ReplayReport:
        from holedger.replay.runs import verify_records

        return verify_records(run_id, self.raw[run_id], self, trusted_keys=trusted)


def read_bundle(path: Path) -> BundledRuns:
    """Parse an audits bundle file; UsageError naming the line for anything malformed."""
    if not path.is_file():
        raise UsageError(f"{path}: no such audits bundle", hint="write one with 'audit export'")
    return parse_bundle(path.read_bytes(), str(path))


def parse_bundle(data: bytes, where: str) -> BundledRuns:
    """Parse the bytes of an audits bundle (``where`` names them in errors)."""
    bundle: BundledRuns | None = None
    for number, text in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        try:
            line = json.loads(text)
            if bundle is None:
                if line.get("format") != FORMAT or line.get("version") != VERSION:
                    raise ValueError(f"not a {FORMAT} version {VERSION} file")
                bundle = BundledRuns(str(line["run_id"]), [str(a) for a in line["audits"]])
            elif "run" in line:
                bundle.raw.setdefault(str(line["run"]), []).append(
                    base64.b64decode(line["record"], validate=True)
                )
            elif "audit" in line:
                bundle.audit_raw.setdefault(str(line["audit"]), []).append(
                    base64.b64decode(line["record"], validate=True)
                )
            elif "blob" in line:
                bundle.blobs[str(line["blob"])] = base64.b64decode(line["data"], validate=True)
            else:
                raise ValueError("an entry of no known kind")
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise UsageError(
                f"{where}: line {number} is not a valid audits bundle entry ({exc})",
                hint="write the file with 'holedger audit export'",
            ) from exc
    if bundle is None:
        raise UsageError(f"{where}: empty audits bundle")
    return bundle


def verify_bundle_audits(path: Path, trusted_keys: Sequence[PublicKey] = ()) -> list[Any]:
    """Verify every audit of an audits bundle file from the file alone; their reports."""
    return verify_audits(read_bundle(path), str(path), trusted_keys)


def verify_audits(
    bundle: BundledRuns, where: str, trusted_keys: Sequence[PublicKey] = ()
) -> list[Any]:
    """Verify every audit of a parsed audits bundle; their reports."""
    from holedger.audit.verify import verify_audit

    engine = create_engine("sqlite://", poolclass=StaticPool)
    log = AuditLog(engine)
    try:
        for audit_id in bundle.audits:
            if not bundle.audit_raw.get(audit_id):
                raise UsageError(f"{where}: audit {audit_id} has no record in the bundle")
            log.write_raw(audit_id, bundle.audit_raw[audit_id])
        with tempfile.TemporaryDirectory(prefix="holedger-audits-") as home:
            settings = Settings.resolve(Path(home))  # no task, no code: those are skipped
            return [
                verify_audit(settings, bundle, log, audit_id, trusted_keys=trusted_keys)
                for audit_id in bundle.audits
            ]
    except VerificationError as exc:
        raise UsageError(f"{where}: {exc.message}") from exc
    finally:
        engine.dispose()


def attachment() -> Any:
    """The ``audits`` attachment of run bundles (holedger.bundles.attachments): ``export
    --audits`` carries the run's audits bundle, ``verify`` verifies every audit in it."""
    from holedger.bundles.attachments import Attachment, Verdict

    def make(ledger: Any, run_id: str) -> bytes:
        return audits_bytes(ledger, run_id)[0]

    def verify(data: bytes, run_id: str, trusted: Sequence[PublicKey]) -> Verdict:
        try:
            bundle = parse_bundle(data, "the bundled audits")
            if bundle.run_id != run_id:
                return Verdict([f"the bundled audits are of run {bundle.run_id}"], "", {})
            reports = verify_audits(bundle, "the bundled audits", trusted)
        except UsageError as exc:
            return Verdict([exc.message], "", {})
        problems = [
            f"audit {r.audit_id} fails {', '.join(r.failed_checks())}: {r.failures[0]}"
            for r in reports
            if not r.verified
        ]
        rows = [
            {"audit_id": r.audit_id, "verified": r.verified, "failed_checks": r.failed_checks()}
            for r in reports
        ]
        detail = f"{len(reports)} audits of the run verified from the bundle"
        return Verdict(problems, detail, {"audits": rows})

    return Attachment("audits", make, verify)
