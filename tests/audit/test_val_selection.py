"""B5 validation selection end to end on the tiny task: the nominee H^ tables four of the
five hard search questions, another candidate all five, so the val-selected candidate is
not H^; the audit has the server score it on the held-out split (a control evaluation
recorded in the audited run), and the decomposition's transfer check compares the two."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from holedger.audit.hda import neutralize, open_audit, read_audit, run_hda
from holedger.audit.verify import verify_audit
from holedger.cli import cli
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .conftest import AuditedRun, service, shortcut_tree


def test_the_val_selected_candidate_is_scored_on_held_out_and_compared(
    audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    svc = service(audited.settings, ledger)
    seed_dir = audited.task_dir / "seed"
    try:
        run = svc.open_run(str(audited.task_dir), optimizer="val-selection").run_id
        all_five = svc.commit_candidate(run, shortcut_tree(seed_dir, tmp_path / "s")).candidate
        four = shortcut_tree(seed_dir, tmp_path / "d", leave_out=("val-6",))
        hhat = svc.commit_candidate(run, four).candidate
        for cand in ("seed", all_five, hhat):
            svc.evaluate(run, cand, "dev")
            svc.evaluate(run, cand, "val")
        svc.nominate(run, hhat)  # val: 7/8, against 1 for the table of all five
    finally:
        svc.close()
    ctx = audited.context(ledger)
    audit_id = open_audit(ctx, run)
    state = run_hda(ctx, audit_id, resamples=2000)
    assert state.gate is not None and state.gate.gate["delta"] == "2/7"  # 4 of 14
    assert state.gate.gate["significant"]
    [scored] = [c for c in state.controls if c.harness == "Hval"]
    assert scored.candidate == all_five and scored.split == "test"
    neutral = tmp_path / "n"
    shutil.copytree(seed_dir, neutral)
    state, _ = neutralize(ctx, audit_id, neutral)
    assert state.decomposed is not None and state.decomposed.transfer is not None
    chosen: dict[str, Any] = state.decomposed.transfer["val_selection"]
    # neither table holds a test question: both score E(H0) on the held-out split
    assert chosen == {
        "search_selected": hhat,
        "val_selected": all_five,
        "held_out_search_selected": "0",
        "held_out_val_selected": "0",
        "improves": False,
        "worsens": False,
        "val_below_search_gain": True,
    }
    # the held-out control is in the audited run, after its close, and both verify
    records = list(ledger.records(run))
    tail = [r for r in records if r.type == "AuditControlEvaluated"]
    assert any(r.payload["harness"] == "Hval" and r.payload["split"] == "test" for r in tail)
    assert replay_run(ledger, run).verified
    report = verify_audit(audited.settings, ledger, ctx.log, audit_id)
    assert report.verified, report.failures
    # a run bundle carrying the run's (one, honest) audit verifies, the audit with it
    bundle = tmp_path / "run.bundle"
    exported = CliRunner().invoke(
        cli, ["--home", str(audited.settings.home), "export", run, "-o", str(bundle), "--audits"]
    )
    assert exported.exit_code == 0, exported.output
    verified = CliRunner().invoke(
        cli, ["--home", str(audited.settings.home), "verify", str(bundle), "--json"]
    )
    assert verified.exit_code == 0, verified.output
    checks = {c["name"]: c for c in json.loads(verified.output)["checks"]}
    assert checks["audits"]["ok"] and "1 audits of the run verified" in checks["audits"]["detail"]
    assert read_audit(ctx.log, audit_id).decomposed == state.decomposed
