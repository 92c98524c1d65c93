"""An audits bundle: a run's audits, portable, verifiable without the ledger they came from.

``holedger audit export RUN -o FILE`` writes one file (JSON Lines, format
``holedger-audits`` version 2): a header naming the run and its audits, then every record
of each audit, every record of the audited run, of the control runs its audits name and of
the run's pinned seed-baseline run, each as the exact stored bytes (base64), every blob
those records name that the ledger holds, and what the detector findings and the B6 strata
are recomputed from (holedger.audit.carried): the task (spec and cases) under the task
digest the run signed, and the trees of the seed and of H^ under the git tree ids the run
committed, each file once by its git blob id. ``holedger audit verify --bundle FILE``
verifies each audit from the file alone, with the checks of ``audit verify``: the runs
replay from their bundled records, the carried task and trees are pinned to the run's
digests (check ``evidence``), and every number is recomputed from them. A version 1 file
carries no task and no tree: it verifies, saying what it could not recompute.
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

from holedger.audit import carried
from holedger.audit.facts import RunFacts, read_run
from holedger.audit.hda import read_audit
from holedger.audit.log import AuditLog
from holedger.bundles.attachments import Attachment, Verdict
from holedger.config import Settings
from holedger.errors import NotFoundError, UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey
from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport

FORMAT = "holedger-audits"
VERSION = 2
READABLE = (1, 2)  # version 1: written before bundles carried the task and trees


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


def audits_bytes(
    ledger: Ledger, run_ref: str, settings: Settings | None = None
) -> tuple[bytes, dict[str, Any]]:
    """The run's audits (every audit bound to it) with what verifying them needs, as the
    bytes of an audits bundle, and a summary. With the home's ``settings``, the task and
    candidate trees the findings and strata are recomputed from go in too, when they are
    at hand and the ones the run signed."""
    run_id = ledger.resolve_run(run_ref)
    log = AuditLog(ledger.app.engine)
    audits = [a for a in log.audit_ids() if read_audit(log, a).opened.run_id == run_id]
    if not audits:
        raise NotFoundError(f"run {run_id} has no audit", hint="see 'holedger audit list'")
    runs = [run_id]
    facts = read_run(run_id, ledger.records(run_id))
    if facts.baseline_run is not None and ledger.has_run(facts.baseline_run):
        runs.append(facts.baseline_run)
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
    data = _jsonl(lines)
    evidence = carried.from_home(settings, facts) if settings is not None else None
    extra = _jsonl(carried.bundle_lines(evidence, facts)) if evidence is not None else b""
    summary = {
        "run_id": run_id,
        "audits": audits,
        "runs": runs,
        "blobs": len(blobs),
        "evidence": {
            "task": bool(evidence and evidence.task),
            "trees": len(evidence.files) if evidence else 0,
            "bytes": len(extra),
            "not_carried": (evidence.problems + evidence.missing) if evidence else ["no home"],
        },
    }
    return data + extra, summary


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    text = "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
    return text.encode("utf-8")


def export_audits(
    ledger: Ledger, run_ref: str, out: Path, settings: Settings | None = None
) -> dict[str, Any]:
    """Write the run's audits bundle to ``out``, whole or not at all."""
    data, summary = audits_bytes(ledger, run_ref, settings)
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
    tasks: dict[str, Any] = field(default_factory=dict)  # task digest -> spec and cases
    trees: dict[str, Any] = field(default_factory=dict)  # git tree id -> its file listing
    git_blobs: dict[str, bytes] = field(default_factory=dict)  # git blob id -> bytes

    def evidence(self, run: RunFacts) -> carried.Evidence:
        """The task and candidate trees carried for ``run``, pinned to its digests."""
        return carried.from_bundle(self.tasks, self.trees, self.git_blobs, run)

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

    def run_records(self, run_id: str) -> list[Record] | None:
        """A bundled run's records (the control runs replay cross-checks), or None."""
        return list(self.records(run_id)) if run_id in self.raw else None

    def replay_report(self, run_id: str, trusted: Sequence[PublicKey]) -> ReplayReport:
        from holedger.replay.inputs import CheckInputs
        from holedger.replay.runs import verify_records

        inputs = CheckInputs(runs=self)  # the control runs are bundled too
        return verify_records(run_id, self.raw[run_id], self, trusted_keys=trusted, inputs=inputs)


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
                if line.get("format") != FORMAT or line.get("version") not in READABLE:
                    raise ValueError(f"not a {FORMAT} file of version 1 or {VERSION}")
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
            elif "task" in line:
                bundle.tasks[str(line["task"])] = {"spec": line["spec"], "cases": line["cases"]}
            elif "tree" in line:
                bundle.trees[str(line["tree"])] = list(line["files"])
            elif "git_blob" in line:
                bundle.git_blobs[str(line["git_blob"])] = base64.b64decode(
                    line["data"], validate=True
                )
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
            settings = Settings.resolve(Path(home))  # the task and code: from the bundle
            return [
                verify_audit(
                    settings,
                    bundle,
                    log,
                    audit_id,
                    trusted_keys=trusted_keys,
                    evidence=bundle.evidence,
                )
                for audit_id in bundle.audits
            ]
    except VerificationError as exc:
        raise UsageError(f"{where}: {exc.message}") from exc
    finally:
        engine.dispose()


def attachment() -> Attachment:
    """The ``audits`` attachment of run bundles (holedger.bundles.attachments): ``export
    --audits`` carries the run's audits bundle, ``verify`` verifies every audit in it."""

    def make(ledger: Any, settings: Any, run_id: str) -> bytes:
        return audits_bytes(ledger, run_id, settings)[0]

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
            {
                "audit_id": r.audit_id,
                "verified": r.verified,
                "failed_checks": r.failed_checks(),
                "not_recomputed": r.warnings,
            }
            for r in reports
        ]
        detail = f"{len(reports)} audits of the run verified from the bundle"
        skipped = sorted({w for r in reports for w in r.warnings if not w.startswith("auditor")})
        if skipped:
            detail += f" (not recomputed: {'; '.join(skipped)})"
        return Verdict(problems, detail, {"audits": rows})

    return Attachment("audits", make, verify)
