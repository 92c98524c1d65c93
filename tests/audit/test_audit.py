"""End to end: an audit of a run whose nominee hard-codes dev and val answers, through
the command line; then the attacks on it, each failing verification by name."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from ledger.attacker import Attacker, resign_run

from holedger.audit.events import AUDIT_EVENT_TYPES
from holedger.audit.hda import open_audit, read_audit, run_hda
from holedger.audit.log import AuditLog, audit_origin, parse_audit_record, sign_audit_event
from holedger.audit.verify import verify_audit
from holedger.cli import cli
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.store import Ledger
from holedger.protocol.runs import control_scores_digest
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run
from holedger.schemas.events import ControlOf
from holedger.schemas.types import ZERO_HASH

from .conftest import AuditedRun, service


def run_cli(audited: AuditedRun, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(audited.settings.home), *args])


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    text = (result.stderr or result.output).strip()
    assert "Traceback" not in text
    return text.splitlines()[0]


@pytest.fixture(scope="module")
def finished(audited: AuditedRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The whole protocol through the CLI: open, hda, show, neutralize, verify."""
    key = str(audited.auditor_path)
    opened = run_cli(audited, "audit", "open", audited.run_id, "--key", key, "--json")
    assert opened.exit_code == 0, opened.output
    audit_id = json.loads(opened.output)["audit_id"]
    hda = run_cli(audited, "audit", "hda", audit_id, "--key", key, "--resamples", "2000", "--json")
    assert hda.exit_code == 0, hda.output
    neutral = tmp_path_factory.mktemp("neutral") / "tree"
    shutil.copytree(audited.task_dir / "seed", neutral)
    done = run_cli(audited, "audit", "neutralize", audit_id, "--from", str(neutral), "--key", key)
    assert done.exit_code == 0, done.output
    verified = run_cli(audited, "audit", "verify", audit_id, "--json")
    shown = run_cli(audited, "audit", "show", audit_id, "--json")
    return {
        "audit_id": audit_id,
        "hda": json.loads(hda.output),
        "neutralize": done.output,
        "verify": verified,
        "show": json.loads(shown.output),
        "show_text": run_cli(audited, "audit", "show", audit_id).output,
    }


def test_the_gain_is_significant_and_the_lookup_table_is_found(finished: dict[str, Any]) -> None:
    hda = finished["hda"]
    # 14 search cases (6 dev, 8 val); the table answers the 5 "hard" ones the seed misses.
    assert hda["gate"]["delta"] == "5/14" and hda["gate"]["significant"]
    assert hda["gate"]["resamples"] == 2000 and hda["gate"]["seed"] == 0
    assert hda["status"] == "pending_neutral"
    [finding] = hda["findings"]
    assert finding["category"] == "lookup_table" and finding["source"] == "detector"
    assert finding["evidence"]["case_ids"] == ["dev-0", "dev-3", "val-0", "val-3", "val-6"]
    assert finding["evidence"]["locations"][0] == "harness/__main__.py:3"
    # B6: the tagged hard cases carry the whole gain
    strata = {row["tag"]: row for row in hda["strata"]}
    assert strata["hard"]["cases"] == 5 and strata["hard"]["delta"] == "1"
    assert strata["(untagged)"]["cases"] == 9 and strata["(untagged)"]["delta"] == "0"
    # no model in this task: k cannot be matched on calls or tokens, and says so
    assert hda["scale"]["k"] == 1 and hda["scale"]["basis"] == "none"


def test_held_out_strata_and_the_type_left_out_of_the_search(finished: dict[str, Any]) -> None:
    hda = finished["hda"]
    # test-0 ("hard test 0") is answered wrong by both (the table holds dev and val
    # questions only); test-1 is easy, tagged "unseen", and right for both: K = 1 each.
    rows = {row["tag"]: row for row in hda["held_out_strata"]}
    assert rows["hard"] == {
        "tag": "hard",
        "cases": 1,
        "s_candidate": "0",
        "s_base": "0",
        "delta": "0",
    }
    assert rows["unseen"]["s_candidate"] == "1" and rows["unseen"]["s_base"] == "1"
    # "unseen" is on no dev or val case: left out of the search; S_test(H^) = 1 >= 19/20
    [left] = hda["left_out_types"]
    assert left["tag"] == "unseen" and left["near_perfect"] is True
    assert "left out unseen (no search case has it)" in finished["show_text"]


def test_a_forged_left_out_type_fails_the_gate_check(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    def forge(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "GateComputed":
            rows = [{**row, "near_perfect": False} for row in payload["left_out_types"]]
            payload = {**payload, "left_out_types": rows}
        return payload

    assert "gate" in failed(audited, ledger, copy_of(forge))


def test_neutralizing_removes_the_shortcut_and_o_is_the_whole_gain(
    finished: dict[str, Any], audited: AuditedRun
) -> None:
    assert "-KNOWN = {" in finished["neutralize"]
    show = finished["show"]
    assert show["status"] == "decomposed"
    assert show["neutral"]["parent"] == audited.nominee
    d = show["decomposition"]
    assert (d["delta"], d["O"], d["T"], d["G"]) == ("5/14", "5/14", "0", "0")
    assert d["shares"] == {"o": "1", "t": "0", "g": "0"}
    assert d["identity_holds"] and d["O_bound"] == "lower" and d["G_bound"] == "upper"
    assert "B2.k" in show["readings"]
    assert "O 5/14 (lower bound)" in finished["show_text"]
    assert "readings (not stated by the method" in finished["show_text"]


def test_the_audit_verifies(finished: dict[str, Any]) -> None:
    result = finished["verify"]
    report = json.loads(result.output)
    assert result.exit_code == 0, report["failures"]
    assert report["verified"] and report["failed_checks"] == []
    names = {c["name"] for c in report["checks"]}
    assert {"gate", "scale", "findings", "neutral", "decomposition", "controls_signed"} <= names


def test_control_evaluations_are_recorded_in_the_audited_run_after_its_close(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    from holedger.replay.runs import replay_run

    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    [*controls] = state.controls
    assert {c.harness for c in controls} == {"Hneutral"}
    for c in controls:
        opened = ledger.run_terms(c.control_run_id)
        assert opened.optimizer == f"hda-control audit={state.audit_id} run={audited.run_id}"
        # the signed field names the audit and the run; the control run's own replay
        # finds it referenced by that run's AuditControlEvaluated events
        assert opened.control_of == ControlOf(audit_id=state.audit_id, run_id=audited.run_id)
        own = replay_run(ledger, c.control_run_id)
        assert own.verified, own.failures
        assert own.sections["control_run"]["evaluations"] >= 1
    records = list(ledger.records(audited.run_id))
    closed = next(r.seq for r in records if r.type == "RunClosed")
    after = [
        r
        for r in records
        if r.seq > closed + 1 and r.payload.get("audit_id", state.audit_id) == state.audit_id
    ]
    # one AuditControlEvaluated per control request (dev, val), server-signed, then a
    # Checkpoint; the audit names each by its seq in the run
    assert [r.type for r in after] == ["AuditControlEvaluated"] * 2 + ["Checkpoint"]
    assert sorted(c.run_seq for c in controls) == [r.seq for r in after[:2]]
    for rec, c in zip(after, sorted(controls, key=lambda c: c.run_seq), strict=False):
        assert rec.role == "server" and rec.payload["audit_id"] == state.audit_id
        assert rec.payload["budget"] == "outside" and rec.payload["disclosed_to"] == "none"
        assert rec.payload["scores_digest"] == c.scores_digest
        assert len(rec.payload["scores"]) == len(c.case_ids) * c.attempts
    # the audit stays bound to the checkpoint right after RunClosed
    assert state.opened.run_checkpoint.size == closed + 1
    report = replay_run(ledger, audited.run_id)
    assert report.verified, report.failures
    section = report.sections["audit_controls"]
    assert state.audit_id in section["audits"] and section["evaluations"] >= 2
    # each cross-checked against the TrialCompleted events of its control run
    assert section["cross_checked"] == section["evaluations"]
    assert section["control_runs_not_at_hand"] == []
    assert section["control_runs_named_by_label"] == []
    # outside the optimizer's budget: the budget section counts the run's requests only
    assert report.sections["budget_table"] == replay_budget_before(ledger, audited.run_id, closed)


def replay_budget_before(ledger: Ledger, run_id: str, closed: int) -> Any:
    """The budget section of the run's replay cut at its close (its final checkpoint)."""
    from holedger.replay.runs import LedgerBlobs, verify_records

    raws = [raw for seq, raw in ledger.raw_records(run_id) if seq <= closed + 1]
    return verify_records(run_id, raws, LedgerBlobs(ledger)).sections["budget_table"]


# ------------------------------------------------------------------ attacks


def resign_audit(
    records: list[bytes], keys: dict[str, SigningKey], edit: Any = None
) -> list[bytes]:
    """Rewrite an audit stream as a holder of its keys could: payloads edited, every event
    re-signed, re-chained, checkpoints recomputed."""
    out, prev, frontier = [], ZERO_HASH, MerkleFrontier()
    for raw in records:
        rec = parse_audit_record(raw)
        payload = dict(rec.payload)
        if edit is not None:
            payload = edit(rec.type, payload)
        audit_id = rec.envelope["audit_id"]
        if rec.type == "Checkpoint":
            root = frontier.root()
            body = checkpoint_body(audit_origin(audit_id), frontier.size, root)
            payload = {
                "size": frontier.size,
                "root": root.hex(),
                "note": sign_note(body, keys["auditor"]),
            }
        assert rec.type in AUDIT_EVENT_TYPES
        forged = sign_audit_event(
            keys[rec.role],
            audit_id=audit_id,
            seq=rec.seq,
            event_type=rec.type,
            role=rec.role,  # type: ignore[arg-type]
            prev_hash=prev,
            payload=payload,
        )
        out.append(forged.raw)
        prev = hashlib.sha256(forged.signed).hexdigest()
        frontier.append(forged.leaf_hash)
    return out


@pytest.fixture
def copy_of(finished: dict[str, Any], ledger: Ledger, audited: AuditedRun):  # type: ignore[no-untyped-def]
    """A fresh copy of the finished audit under a new id, to attack."""
    log = AuditLog(ledger.app.engine)

    def make(edit: Any = None, keys: dict[str, SigningKey] | None = None) -> str:
        new_id = log.new_id()
        raws = [r.raw for r in log.records(finished["audit_id"])]
        retarget = [raw.replace(finished["audit_id"].encode(), new_id.encode()) for raw in raws]
        signing = keys or {
            "auditor": SigningKey.load(audited.auditor_path),
            "server": SigningKey.load(audited.settings.key_path),
        }
        log.write_raw(new_id, resign_audit(retarget, signing, edit))
        return new_id

    return make


def failed(audited: AuditedRun, ledger: Ledger, audit_id: str) -> list[str]:
    report = verify_audit(audited.settings, ledger, AuditLog(ledger.app.engine), audit_id)
    return report.failed_checks()


def test_an_untouched_copy_verifies(copy_of: Any, audited: AuditedRun, ledger: Ledger) -> None:
    # the copy's controls name the original audit: only that binding of the controls fails
    assert failed(audited, ledger, copy_of()) == ["controls_signed"]


def test_a_forged_share_fails_decomposition(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    def forge(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "Decomposed" and payload["decomposition"]:
            d = dict(payload["decomposition"])
            d["shares"] = {"o": "1/5", "t": "0", "g": "4/5"}
            payload = {**payload, "decomposition": d}
        return payload

    assert "decomposition" in failed(audited, ledger, copy_of(forge))


def test_an_audit_bound_to_another_run_fails_binding(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    # the seed-baseline run of the same task and server: closed, but not the audited run
    other = next(r for r in ledger.run_ids() if ledger.run_terms(r).optimizer == "seed-baseline")
    assert other is not None

    def rebind(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "AuditOpened":
            payload = {**payload, "run_id": other}
        return payload

    assert "audit_binding" in failed(audited, ledger, copy_of(rebind))


def test_a_checkpoint_the_run_does_not_have_fails_binding(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    def shift(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "AuditOpened":
            cp = payload["run_checkpoint"]
            payload = {**payload, "run_checkpoint": {"size": cp["size"] + 1, "root": cp["root"]}}
        return payload

    assert "audit_binding" in failed(audited, ledger, copy_of(shift))


def test_a_control_evaluation_the_optimizer_was_shown_fails(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    run_request = next(
        r.payload["request_id"]
        for r in ledger.records(audited.run_id)
        if r.type == "DisclosureProjected"
    )

    def shown(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "ControlEvaluated":
            payload = {**payload, "request_id": run_request, "control_run_id": audited.run_id}
        return payload

    checks = failed(audited, ledger, copy_of(shown))
    assert "controls_undisclosed" in checks


def test_a_control_evaluation_signed_by_the_auditor_fails_integrity(
    copy_of: Any, audited: AuditedRun, ledger: Ledger
) -> None:
    auditor = SigningKey.load(audited.auditor_path)
    assert "audit_integrity" in failed(
        audited, ledger, copy_of(keys={"auditor": auditor, "server": auditor})
    )


@contextlib.contextmanager
def forged_run(
    audited: AuditedRun, run_id: str, edit: Callable[[str, dict[str, Any]], dict[str, Any]]
) -> Iterator[None]:
    """The run's stream rewritten with ``edit`` and re-signed by the server key, for the
    ``with`` block; restored after."""
    attacker = Attacker(audited.settings.ledger_url)
    rows = attacker.rows(run_id)
    original = [r.state for r in rows]
    forged = resign_run(rows, SigningKey.load(audited.settings.key_path), edit=edit)
    try:
        for row, raw in zip(rows, forged, strict=True):
            attacker.set_state(run_id, row.version, raw)
        yield
    finally:
        for row, raw in zip(rows, original, strict=True):
            attacker.set_state(run_id, row.version, raw)
        attacker.close()


@contextlib.contextmanager
def forged_control(
    audited: AuditedRun, cid: str, edit: Callable[[str, dict[str, Any]], dict[str, Any]]
) -> Iterator[None]:
    """Control run ``cid`` re-signed with ``edit``, and the audited run re-signed with that
    control run's new tree heads in its AuditControlEvaluated events (all a server key
    holder could do), for the ``with`` block; restored after."""
    from holedger.ledger.fastpath import parse_record

    attacker = Attacker(audited.settings.ledger_url)
    rows = attacker.rows(cid)
    attacker.close()
    key = SigningKey.load(audited.settings.key_path)
    leaves = [parse_record(raw).leaf_hash for raw in resign_run(rows, key, edit=edit)]

    def rehead(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype != "AuditControlEvaluated" or payload["control_run_id"] != cid:
            return payload
        frontier = MerkleFrontier()
        for leaf in leaves[: payload["control_size"]]:
            frontier.append(leaf)
        return {**payload, "control_root": frontier.root().hex()}

    with forged_run(audited, cid, edit), forged_run(audited, audited.run_id, rehead):
        yield


def replayed_afresh(audited: AuditedRun, run_id: str) -> ReplayReport:
    """The run replayed from a ledger opened now (it reads the forged rows)."""
    fresh = Ledger.from_settings(audited.settings)
    try:
        return replay_run(fresh, run_id)
    finally:
        fresh.close()


def audit_controls_failures(audited: AuditedRun, run_id: str) -> list[str]:
    """The run replayed afresh: it fails the check audit_controls alone; the reasons."""
    replayed = replayed_afresh(audited, run_id)
    assert replayed.failed_checks() == ["audit_controls"], replayed.failures
    return [f.reason for f in replayed.failures]


def test_a_resigned_control_score_fails_controls_signed(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    control_run = state.controls[0].control_run_id
    flipped = {"done": False}

    def lower(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "TrialCompleted" and payload["score"] == "1" and not flipped["done"]:
            flipped["done"] = True
            payload = {**payload, "score": "0"}
        return payload

    with forged_run(audited, control_run, lower):
        assert "controls_signed" in failed(audited, ledger, finished["audit_id"])
        # the audited run's own replay holds its AuditControlEvaluated to the control
        # run: neither the stated tree head nor the stated scores are the control run's
        reasons = audit_controls_failures(audited, audited.run_id)
        assert any(f"control run {control_run} has no tree of size" in r for r in reasons)
        assert any("its scores are not the TrialCompleted events" in r for r in reasons)
    assert failed(audited, ledger, finished["audit_id"]) == []


def renamed(**fields: str | None) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """An edit of RunOpened: ``control_of`` replaced (None: removed, as in a control run
    opened before the field), ``optimizer`` relabelled when given."""

    def edit(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype != "RunOpened":
            return payload
        payload = dict(payload)
        if "control_of" in fields:
            payload.pop("control_of", None)
            if fields["control_of"] is not None:
                audit_id, run_id = str(fields["control_of"]).split("/")
                payload["control_of"] = {"audit_id": audit_id, "run_id": run_id}
        if fields.get("optimizer") is not None:
            payload["optimizer"] = fields["optimizer"]
        return payload

    return edit


OTHER = "0fedcba9-8765-4321-8fed-cba987654321"


@pytest.mark.parametrize("other", ["audit", "run"])
def test_a_control_run_whose_control_of_names_another_audit_or_run_fails(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger, other: str
) -> None:
    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    cid = state.controls[0].control_run_id
    named = f"{OTHER}/{audited.run_id}" if other == "audit" else f"{state.audit_id}/{OTHER}"
    with forged_control(audited, cid, renamed(control_of=named)):
        reasons = audit_controls_failures(audited, audited.run_id)
        audit_id, run_id = named.split("/")
        # the tree heads are the forged run's: only the name fails, for each evaluation
        assert reasons and all(
            f"control run {cid}'s RunOpened does not name this audit and run (its control_of "
            f"names audit {audit_id} of run {run_id})" in r
            for r in reasons
        ), reasons
        assert "controls_signed" in failed(audited, ledger, finished["audit_id"])
        # and the control run's own replay: the run it names does not refer to it so
        own = replayed_afresh(audited, cid)
        assert own.failed_checks() == ["control_run"], own.failures
        assert own.failures[0].type == "RunOpened"
        assert (
            f"names this run for audit {state.audit_id}" in own.failures[0].reason
            if other == "audit"
            else f"run {OTHER}: that run is not in this ledger" in own.failures[0].reason
        )
    assert replay_run(ledger, audited.run_id).verified


def test_a_control_run_without_control_of_falls_back_to_its_label(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    cid = state.controls[0].control_run_id
    # removed, the label still naming the audit and run (a log written before the field):
    # it verifies, and the check says it was named by its label only
    with forged_control(audited, cid, renamed(control_of=None)):
        report = replayed_afresh(audited, audited.run_id)
        own = replayed_afresh(audited, cid)
        assert report.verified, report.failures
        assert report.sections["audit_controls"]["control_runs_named_by_label"] == [cid]
        [check] = [c for c in report.checks if c.name == "audit_controls"]
        assert "1 control run opened before control_of, named by its optimizer label" in (
            check.detail
        )
        assert own.verified and "control_run" not in own.sections
    # removed, and the label naming another audit: it fails by name
    relabel = renamed(control_of=None, optimizer=f"hda-control audit={OTHER} run=elsewhere")
    with forged_control(audited, cid, relabel):
        reasons = audit_controls_failures(audited, audited.run_id)
        assert any(
            f"control run {cid}'s RunOpened does not name this audit and run (no control_of; "
            "its optimizer label names another)" in r
            for r in reasons
        ), reasons
    # relabelled with the field kept: the signed field decides
    with forged_control(
        audited, cid, renamed(optimizer=f"hda-control audit={OTHER} run=elsewhere")
    ):
        assert replayed_afresh(audited, audited.run_id).verified
    assert replay_run(ledger, audited.run_id).verified


def test_control_runs_are_left_out_of_the_analyses_by_their_control_of(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    from holedger.analysis.gains import gather
    from holedger.analysis.sources import from_runs

    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    controls = {c.control_run_id for c in state.controls}
    url = audited.settings.ledger_url

    def read() -> tuple[set[str], set[str], dict[str, str]]:
        fresh = Ledger.from_settings(audited.settings)
        try:
            kept = gather(
                ledger=fresh,
                bundles=(),
                task_id=None,
                verify=False,
                trusted_keys=(),
                excluded=[],
                no_baseline=[],
            )
        finally:
            fresh.close()
        source = from_runs(ledger_url=url, verify=False)
        return {g.run_id for g in kept}, set(source.scored), dict(source.left_out)

    gains, scored, left = read()
    assert audited.run_id in gains and audited.run_id in scored
    why = f"a control run of audit {state.audit_id} of run {audited.run_id}, no optimizer's search"
    assert controls and all(left[c] == why for c in controls)
    assert not controls & (gains | scored)
    # the field decides: the scored audited run, re-signed with control_of, is left out of
    # the gains and the grid's source, and named as a control run
    with forged_run(audited, audited.run_id, renamed(control_of=f"{OTHER}/{OTHER}")):
        gains, scored, left = read()
    assert audited.run_id not in gains | scored
    assert left[audited.run_id] == (
        f"a control run of audit {OTHER} of run {OTHER}, no optimizer's search"
    )


def test_a_resigned_control_score_in_the_audited_run_fails(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    key = SigningKey.load(audited.settings.key_path)
    attacker = Attacker(audited.settings.ledger_url)
    rows = attacker.rows(audited.run_id)
    original = [r.state for r in rows]

    def lower(rehash: bool) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
        def edit(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
            if etype != "AuditControlEvaluated" or payload["audit_id"] != finished["audit_id"]:
                return payload
            scores = [dict(s) for s in payload["scores"]]
            scores[0]["score"] = "1" if scores[0]["score"] == "0" else "0"
            payload = {**payload, "scores": scores}
            if rehash:
                payload["scores_digest"] = control_scores_digest(
                    (s["case_id"], s["attempt"], Fraction(s["score"])) for s in scores
                )
            return payload

        return edit

    log = AuditLog(ledger.app.engine)
    try:
        # the score changed, its digest not: the run's own replay names it
        for row, raw in zip(rows, resign_run(rows, key, edit=lower(False)), strict=True):
            attacker.set_state(audited.run_id, row.version, raw)
        assert audit_controls_failures(audited, audited.run_id)
        # re-hashed too: its form holds, but its scores are no longer the control run's
        # trials (the run's replay names it), nor what the audit's server statement says
        for row, raw in zip(rows, resign_run(rows, key, edit=lower(True)), strict=True):
            attacker.set_state(audited.run_id, row.version, raw)
        reasons = audit_controls_failures(audited, audited.run_id)  # one per evaluation
        assert reasons and all(
            "its scores are not the TrialCompleted events of request" in r for r in reasons
        )
        report = verify_audit(audited.settings, ledger, log, finished["audit_id"])
        assert report.failed_checks() == ["run_verified", "controls_signed"], report.failures
        assert "records no such control evaluation" in report.checks["controls_signed"][1]
    finally:
        for row, raw in zip(rows, original, strict=True):
            attacker.set_state(audited.run_id, row.version, raw)
        attacker.close()
    assert verify_audit(audited.settings, ledger, log, finished["audit_id"]).verified


def test_an_audit_naming_a_control_before_run_closed_fails_undisclosed(
    copy_of: Any, finished: dict[str, Any], audited: AuditedRun, ledger: Ledger
) -> None:
    state = read_audit(AuditLog(ledger.app.engine), finished["audit_id"])
    assert state.controls

    def earlier(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "ControlEvaluated":
            payload = {**payload, "run_seq": 3}
        return payload

    report = verify_audit(audited.settings, ledger, AuditLog(ledger.app.engine), copy_of(earlier))
    assert "controls_undisclosed" in report.failed_checks()
    assert "before its RunClosed" in report.checks["controls_undisclosed"][1]


def test_an_audits_bundle_verifies_from_the_file_alone(
    finished: dict[str, Any], audited: AuditedRun, tmp_path: Path
) -> None:
    out = tmp_path / "audits.jsonl"
    exported = run_cli(audited, "audit", "export", audited.run_id, "-o", str(out), "--json")
    assert exported.exit_code == 0, exported.output
    summary = json.loads(exported.output)
    assert finished["audit_id"] in summary["audits"] and len(summary["runs"]) >= 2
    carried = summary["evidence"]
    assert carried["task"] and carried["trees"] == 2 and carried["not_carried"] == []
    lines = out.read_text().splitlines()
    extra = [line for line in lines if {"task", "tree", "git_blob"} & set(json.loads(line))]
    assert carried["bytes"] == sum(len(line) + 1 for line in extra)
    result = run_cli(audited, "audit", "verify", "--bundle", str(out), "--json")
    reports = {r["audit_id"]: r for r in json.loads(result.output)["audits"]}
    mine = reports[finished["audit_id"]]
    assert mine["verified"], mine["failures"]
    assert mine["warnings"] == []
    checks = {c["name"]: c for c in mine["checks"]}
    assert checks["run_verified"]["ok"] and checks["controls_signed"]["ok"]
    assert checks["evidence"]["detail"].endswith("in the bundle: the ones the run signed")
    # the findings and the B6 strata recomputed from the bundle alone: the numbers
    # verifying against the ledger gives, which are the ones the audit recorded
    home = json.loads(finished["verify"].output)
    assert home["recomputed"] == mine["recomputed"]
    assert {c["name"]: c["detail"] for c in home["checks"]} == {
        **{c["name"]: c["detail"] for c in mine["checks"]},
        "evidence": checks["evidence"]["detail"].replace("in the bundle", "in the home"),
    }
    recorded = finished["hda"]
    assert mine["recomputed"]["findings"] == [f["evidence"] for f in recorded["findings"]]
    assert mine["recomputed"]["strata"] == recorded["strata"]
    assert mine["recomputed"]["held_out_strata"] == recorded["held_out_strata"]
    assert mine["recomputed"]["left_out_types"] == recorded["left_out_types"]
    assert (
        checks["findings"]["detail"] == f"{len(recorded['findings'])} detector findings re-derived"
    )

    def forged(edit: Any) -> Path:
        path = tmp_path / f"forged-{len(list(tmp_path.iterdir()))}.jsonl"
        path.write_text("\n".join(edit(json.loads(line)) for line in lines) + "\n")
        return path

    def lower_share(entry: dict[str, Any]) -> str:
        if entry.get("audit") == finished["audit_id"]:
            raw = base64.b64decode(entry["record"])
            if b'"type":"Decomposed"' in raw and b'"o":"1"' in raw:
                entry["record"] = base64.b64encode(raw.replace(b'"o":"1"', b'"o":"0"')).decode()
        return json.dumps(entry)

    def lower_control(entry: dict[str, Any]) -> str:
        raw = base64.b64decode(entry.get("record", ""))
        if entry.get("run") == audited.run_id and b'"type":"AuditControlEvaluated"' in raw:
            entry["record"] = base64.b64encode(
                raw.replace(b'"score":"1"', b'"score":"0"', 1)
            ).decode()
        return json.dumps(entry)

    def report_of(path: Path) -> dict[str, Any]:
        result = run_cli(audited, "audit", "verify", "--bundle", str(path), "--json")
        by_id = {r["audit_id"]: r for r in json.loads(result.output)["audits"]}
        assert result.exit_code == (0 if by_id[finished["audit_id"]]["verified"] else 1)
        return dict(by_id[finished["audit_id"]])

    def failed_in(path: Path) -> list[str]:
        return list(report_of(path)["failed_checks"])

    # a share changed in the bundled audit: its signature no longer holds
    assert "audit_integrity" in failed_in(forged(lower_share))
    # a control score changed in the bundled run: the run no longer replays
    assert "run_verified" in failed_in(forged(lower_control))
    bad = tmp_path / "not-a-bundle.jsonl"
    bad.write_text("{}\n")
    error = run_cli(audited, "audit", "verify", "--bundle", str(bad))
    assert "is not a valid audits bundle entry" in one_line_error(error)


def test_an_audits_bundle_whose_task_or_tree_was_altered_fails_evidence(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    from holedger.audit.bundle import audits_bytes

    lines = [
        json.loads(x)
        for x in audits_bytes(ledger, audited.run_id, audited.settings)[0].split(b"\n")
        if x
    ]

    def failing(edit: Callable[[dict[str, Any]], None]) -> tuple[list[str], str]:
        path = tmp_path / f"altered-{len(list(tmp_path.iterdir()))}.jsonl"
        entries = json.loads(json.dumps(lines))
        for entry in entries:
            edit(entry)
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))
        result = run_cli(audited, "audit", "verify", "--bundle", str(path), "--json")
        assert result.exit_code == 1, result.output
        mine = {r["audit_id"]: r for r in json.loads(result.output)["audits"]}[finished["audit_id"]]
        return mine["failed_checks"], next(c for c in mine["checks"] if c["name"] == "evidence")[
            "detail"
        ]

    def other_answer(entry: dict[str, Any]) -> None:
        if "task" in entry:  # a dev case's expected answer changed, its digest key kept
            entry["cases"]["dev"][0]["expected"] = "SOMETHING ELSE"

    def other_spec(entry: dict[str, Any]) -> None:
        if "task" in entry:
            entry["spec"]["title"] = "another task"

    def other_code(entry: dict[str, Any]) -> None:
        if "git_blob" in entry:  # a file of the seed or of H^ changed, its blob id kept
            data = base64.b64decode(entry["data"])
            if b"KNOWN" in data:
                entry["data"] = base64.b64encode(data.replace(b"KNOWN", b"TABLE")).decode()

    failed, why = failing(other_answer)
    assert failed == ["evidence"] and "dev cases do not hash to the split digest" in why
    failed, why = failing(other_spec)
    assert failed == ["evidence"] and "does not hash to the task digest" in why
    failed, why = failing(other_code)
    assert failed == ["evidence"] and "are not the tree the run committed" in why


def test_an_older_audits_bundle_verifies_and_says_what_it_did_not_recompute(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    from holedger.audit.bundle import audits_bytes
    from holedger.audit.carried import NOT_CARRIED

    entries = [json.loads(x) for x in audits_bytes(ledger, audited.run_id)[0].split(b"\n") if x]
    assert not [e for e in entries if {"task", "tree", "git_blob"} & set(e)]  # no home given
    entries[0]["version"] = 1  # as written before bundles carried the task and trees
    old = tmp_path / "v1.jsonl"
    old.write_text("".join(json.dumps(e) + "\n" for e in entries))
    result = run_cli(audited, "audit", "verify", "--bundle", str(old), "--json")
    mine = {r["audit_id"]: r for r in json.loads(result.output)["audits"]}[finished["audit_id"]]
    assert mine["verified"], mine["failures"]
    checks = {c["name"]: c["detail"] for c in mine["checks"]}
    assert checks["findings"] == "skipped: the task or the candidates' trees not at hand"
    assert checks["gate"].endswith("recomputed; B6 strata not recomputed (no task)")
    assert checks["evidence"] == f"nothing to pin: {NOT_CARRIED}"
    assert mine["warnings"] == [f"not recomputed: {NOT_CARRIED}"]
    assert mine["recomputed"] == {}
    text = run_cli(audited, "audit", "verify", "--bundle", str(old))
    assert NOT_CARRIED in text.output


def test_a_run_bundle_carries_and_verifies_its_audits(
    finished: dict[str, Any], audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    from holedger.audit.bundle import audits_bytes
    from holedger.bundles.export import export_bundle

    out = tmp_path / "run.bundle"
    exported = run_cli(audited, "export", audited.run_id, "-o", str(out), "--audits")
    assert exported.exit_code == 0, exported.output
    result = run_cli(audited, "verify", str(out), "--json")
    report = json.loads(result.output)
    # the run carries every audit bound to it: this module's forged copies fail (each
    # named), the honest one verifies (a run with honest audits only: test_val_selection)
    rows = {row["audit_id"]: row for row in report["audits"]["audits"]}
    assert rows[finished["audit_id"]]["verified"]
    assert rows[finished["audit_id"]]["not_recomputed"] == []  # the task and trees went in
    failing = {f["reason"].split()[1] for f in report["failures"] if f["check"] == "audits"}
    assert finished["audit_id"] not in failing
    assert failing == {a for a, row in rows.items() if not row["verified"]}
    # a share changed in a bundled audit record: verify fails naming the attachment
    data, _ = audits_bytes(ledger, audited.run_id)
    lines = []
    for line in data.decode().splitlines():
        entry = json.loads(line)
        raw = base64.b64decode(entry.get("record", ""))
        if entry.get("audit") == finished["audit_id"] and b'"type":"Decomposed"' in raw:
            entry["record"] = base64.b64encode(raw.replace(b'"o":"1"', b'"o":"0"')).decode()
        lines.append(json.dumps(entry))
    forged = tmp_path / "forged.bundle"
    export_bundle(
        ledger,
        audited.run_id,
        forged,
        repo_path=audited.settings.run_repo(audited.run_id),
        attachments={"audits": ("\n".join(lines) + "\n").encode()},
    )
    result = run_cli(audited, "verify", str(forged), "--json")
    report = json.loads(result.output)
    assert result.exit_code == 1
    assert not report["verified"] and "audits" in [
        c["name"] for c in report["checks"] if not c["ok"]
    ]
    [failure] = [
        f
        for f in report["failures"]
        if f["check"] == "audits" and f["reason"].split()[1] == finished["audit_id"]
    ]
    assert "audit_integrity" in failure["reason"]
    # a run bundle without audits is what it was: no attachment, no audits check
    plain = tmp_path / "plain.bundle"
    assert run_cli(audited, "export", audited.run_id, "-o", str(plain)).exit_code == 0
    names = [
        c["name"]
        for c in json.loads(run_cli(audited, "verify", str(plain), "--json").output)["checks"]
    ]
    assert "audits" not in names


# ------------------------------------------------------------------ bad input


def test_auditing_an_open_run_is_a_one_line_error(audited: AuditedRun, ledger: Ledger) -> None:
    svc = service(audited.settings, ledger)
    try:
        open_run = svc.open_run(str(audited.task_dir), optimizer="still-searching").run_id
    finally:
        svc.close()
    result = run_cli(audited, "audit", "open", open_run, "--key", str(audited.auditor_path))
    assert "is open" in one_line_error(result)


def test_the_run_server_key_as_auditor_key_is_refused(audited: AuditedRun) -> None:
    result = run_cli(
        audited, "audit", "open", audited.run_id, "--key", str(audited.settings.key_path)
    )
    assert "is the server key" in one_line_error(result)


def test_an_unknown_run_is_a_one_line_error(audited: AuditedRun) -> None:
    result = run_cli(audited, "audit", "open", "ffffffff", "--key", str(audited.auditor_path))
    assert result.exit_code == 2 and "no run" in (result.stderr or result.output)


def test_a_neutralized_commit_whose_parent_is_not_hhat_is_refused(
    finished: dict[str, Any], audited: AuditedRun, tmp_path: Path
) -> None:
    result = run_cli(
        audited,
        "audit",
        "neutralize",
        finished["audit_id"],
        "--from",
        str(tmp_path),
        "--parent",
        audited.seed,
        "--key",
        str(audited.auditor_path),
    )
    assert "parent" in one_line_error(result)
    unknown = run_cli(
        audited,
        "audit",
        "neutralize",
        finished["audit_id"],
        "--from",
        str(tmp_path),
        "--parent",
        "0123abcd",
        "--key",
        str(audited.auditor_path),
    )
    assert "not 0123abcd" in one_line_error(unknown)


def test_a_manual_finding_is_signed_and_shown(audited: AuditedRun, ledger: Ledger) -> None:
    ctx = audited.context(ledger)
    audit_id = open_audit(ctx, audited.run_id)
    result = run_cli(
        audited,
        "audit",
        "finding",
        "add",
        audit_id,
        "--category",
        "benchmark_threshold",
        "--evidence",
        "harness/__main__.py:7 fits dev",
        "--key",
        str(audited.auditor_path),
        "--json",
    )
    assert result.exit_code == 0, result.output
    [finding] = json.loads(result.output)["findings"]
    assert finding["source"] == "manual" and finding["category"] == "benchmark_threshold"
    bad = run_cli(
        audited,
        "audit",
        "finding",
        "add",
        audit_id,
        "--category",
        "vibes",
        "--evidence",
        "x",
        "--key",
        str(audited.auditor_path),
    )
    assert "unknown finding category" in one_line_error(bad)


def test_replay_takes_an_audit_id_and_verifies_it(
    finished: dict[str, Any], audited: AuditedRun, copy_of: Any
) -> None:
    result = run_cli(audited, "replay", finished["audit_id"], "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["verified"]

    def forge(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype == "GateComputed":
            payload = {**payload, "gate": {**payload["gate"], "p_value": "0.0001"}}
        return payload

    forged = copy_of(forge)
    result = run_cli(audited, "replay", forged)
    assert result.exit_code == 1
    assert "FAIL" in result.output and "gate" in result.output


def test_a_gain_that_is_not_significant_is_not_decomposed(
    audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    svc = service(audited.settings, ledger)
    same = tmp_path / "same"
    shutil.copytree(audited.task_dir / "seed", same)
    main = same / "harness" / "__main__.py"
    main.write_text(main.read_text() + "# the same harness, reformatted\n")
    try:
        run = svc.open_run(str(audited.task_dir), optimizer="no-gain").run_id
        cand = svc.commit_candidate(run, same).candidate
        for c in ("seed", cand):
            svc.evaluate(run, c, "dev")
        svc.nominate(run, cand)
    finally:
        svc.close()
    ctx = audited.context(ledger)
    audit_id = open_audit(ctx, run)
    state = run_hda(ctx, audit_id, resamples=500)
    assert state.gate is not None and state.gate.gate["delta"] == "0"
    assert not state.gate.gate["significant"] and state.gate.gate["p_value"] == "1"
    assert state.decomposed is not None and state.decomposed.status == "not_significant"
    assert state.scale is None and state.findings == [] and state.controls == []
    report = verify_audit(audited.settings, ledger, ctx.log, audit_id)
    assert report.verified, report.failures
    # the HTML section says what was not computed: no decomposition, so no B5 check, and
    # the run was never scored on the held-out split, so no B6 strata
    from holedger.audit.html import audits_section, check_rows

    section = audits_section(ledger, run)
    assert f"<td>{audit_id}</td><td>B5 transfer</td><td>not computed</td>" in section
    assert "<td>B5 validation selection</td><td>not computed</td>" in section
    # B6 needs no decomposition: the run was scored at close, both test cases are tagged
    assert "<td>B6 held-out stratum unseen</td><td>1 test cases, S_test(H^) 1" in section
    assert "<td>B6 left out unseen</td>" in section
    # a gate recorded without held-out strata (an untagged task, or no held-out scores)
    state = read_audit(ctx.log, audit_id)
    assert state.gate is not None
    state.gate = state.gate.model_copy(update={"held_out_strata": [], "left_out_types": []})
    assert [row[1:] for row in check_rows(state)] == [
        ["B5 transfer", "not computed"],
        ["B5 validation selection", "not computed"],
        ["B6 held-out strata", "not computed (no tagged held-out scores)"],
    ]


def test_the_runs_html_report_has_an_audits_section(
    finished: dict[str, Any], audited: AuditedRun, tmp_path: Path
) -> None:
    from holedger.demo.report import render_run_report

    rendered = render_run_report(audited.settings, audited.run_id, tmp_path / "run.html")
    page = rendered.path.read_text(encoding="utf-8")
    section = page[page.index('<section id="audits">') :]
    assert finished["audit_id"] in section and "lookup_table" in section
    assert "<td>5/14</td>" in section and "1 / 0 / 0" in section
    # B5 and B6 as `audit show` gives them: held-out gain 0 against the search gain 5/14;
    # the hard test case is wrong for both, the "unseen" type (on no search case) right
    checks = section[section.index("B5 transfer and B6") :]
    assert (
        "<td>B5 transfer</td><td>held-out gain 0 against search gain 5/14 "
        "(below: yes, below half: yes, below 0: no)</td>"
    ) in checks
    assert (
        "<td>B6 held-out stratum hard</td><td>1 test cases, S_test(H^) 0, S_test(H0) 0, "
        "difference 0</td>"
    ) in checks
    assert (
        "<td>B6 left out unseen</td><td>no search case has it; S_test(H^) 1 on 1 test cases, "
        "S_test(H0) 1: near-perfect (overfitting)</td>"
    ) in checks
    v = finished["show"]["transfer"]["val_selection"]
    assert v["val_selected"] == v["search_selected"] == audited.nominee
    assert (
        f"<td>B5 validation selection</td><td>val-selected {audited.nominee} (search-selected "
        f"H^ {audited.nominee}): held-out gain 0 against 0 (improves: no, worsens: no, "
        "below the search gain: yes)</td>"
    ) in checks


def test_analysis_hda_counts_the_decomposed_audit(
    finished: dict[str, Any], audited: AuditedRun
) -> None:
    result = run_cli(audited, "analysis", "hda", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    mine = next(s for s in data["settings"] if s["audit_id"] == finished["audit_id"])
    assert mine["shares"] == {"o": "1", "t": "0", "g": "0"} and mine["delta"] == "5/14"
    assert finished["audit_id"] in data["o_plus_t_over_half"]["audits"]
    # B5 across settings: held-out gain 0 against a search gain of 5/14
    assert finished["audit_id"] in data["transfer"]["below_search"]["audits"]
    assert finished["audit_id"] in data["transfer"]["below_half_search"]["audits"]
    assert finished["audit_id"] not in data["transfer"]["below_zero"]["audits"]
    [task] = data["dominant_term_per_task"]
    assert task.startswith("tiny-folder@") and data["dominant_term_per_task"][task]["term"] == "O"
