"""An audit where H^ makes more model calls than H0: k > 1, so H0scale is evaluated by
control trials through the real gateway (offline simulator), aggregated by majority vote,
and verification re-derives k and the aggregate."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
from server.tinytask import CASES, question, write_task_folder

from holedger.audit.hda import AuditContext, neutralize, open_audit, run_hda
from holedger.audit.log import AuditLog
from holedger.audit.verify import verify_audit
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.server.gateway_link import GatewayLink
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import load_server_task
from holedger.tasks.pinning import pin_task

CALLING = """import json, os, sys, urllib.request
case = json.loads(sys.stdin.read())
q = case["q"]
body = json.dumps({"model": os.environ["HOLEDGER_MODEL"],
                   "messages": [{"role": "user", "content": "Answer: " + q}],
                   "max_completion_tokens": 32}).encode()
for _ in range(CALLS):
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30).read()
    except Exception as exc:
        print("call failed:", exc, file=sys.stderr)
KNOWN = {
TABLE}
answer = KNOWN.get(q, q if q.startswith("hard") else q.upper())
print(json.dumps({"answer": answer}))
"""


def harness(calls: int, table: bool) -> str:
    rows = ""
    if table:
        rows = "".join(
            f'    "{question(c)}": "{question(c).upper()}",\n'
            for split in ("dev", "val")
            for c in CASES[split]
            if question(c).startswith("hard")
        )
    return CALLING.replace("CALLS", str(calls)).replace("TABLE", rows)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("scaled")
    settings = Settings.resolve(root / "home")
    Ledger.init_home(settings)
    task_dir = write_task_folder(root / "task")
    (task_dir / "seed" / "harness" / "__main__.py").write_text(harness(1, table=False))
    pin_task(task_dir)
    ledger = Ledger.from_settings(settings)
    link = GatewayLink(ledger)
    service = RunService(
        settings,
        ledger,
        ServerConfig(gateway=link, task_loader=load_server_task, default_backend="process"),
    )
    shortcut = root / "shortcut"
    shutil.copytree(task_dir / "seed", shortcut)
    (shortcut / "harness" / "__main__.py").write_text(harness(3, table=True))
    neutral = root / "neutral"
    shutil.copytree(task_dir / "seed", neutral)
    (neutral / "harness" / "__main__.py").write_text(harness(3, table=False))
    auditor = SigningKey.generate("auditor-b")
    try:
        opened = service.open_run(str(task_dir), optimizer="more-calls")
        nominee = service.commit_candidate(opened.run_id, shortcut).candidate
        for cand in (opened.seed_commit, nominee):
            service.evaluate(opened.run_id, cand, "dev")
            service.evaluate(opened.run_id, cand, "val")
        service.nominate(opened.run_id, nominee)
        ctx = AuditContext(settings, ledger, AuditLog(ledger.app.engine), auditor, gateway=link)
        audit_id = open_audit(ctx, opened.run_id)
        after_hda = run_hda(ctx, audit_id, resamples=1000)
        final, diff = neutralize(ctx, audit_id, neutral)
        report = verify_audit(settings, ledger, ctx.log, audit_id)
        yield {"hda": after_hda, "final": final, "diff": diff, "report": report}
    finally:
        service.close()
        link.close()
        ledger.close()


@pytest.mark.slow
def test_k_is_the_ratio_of_calls_and_h0scale_is_evaluated(scaled: dict[str, object]) -> None:
    state = scaled["hda"]
    assert state.scale is not None  # type: ignore[attr-defined]
    scale = state.scale.scale  # type: ignore[attr-defined]
    assert (scale["k"], scale["basis"], scale["adds_compute"]) == (3, "calls", True)
    assert (scale["candidate_mean"], scale["base_mean"]) == ("3", "1")
    harnesses = [c.harness for c in state.controls]  # type: ignore[attr-defined]
    assert harnesses == ["H0scale", "H0scale"]  # dev and val, 3 attempts per case
    assert {c.attempts for c in state.controls} == {3}  # type: ignore[attr-defined]
    # the seed answers deterministically: the majority of 3 is its single answer
    assert str(state.scale.s_scaled) == "9/14" == state.gate.gate["s_base"]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_shortcut_is_found_neutralized_and_the_audit_verifies(
    scaled: dict[str, object],
) -> None:
    final = scaled["final"]
    d = final.decomposed.decomposition  # type: ignore[attr-defined]
    assert final.gate.gate["significant"]  # type: ignore[attr-defined]
    assert [f.category for f in final.findings] == ["lookup_table"]  # type: ignore[attr-defined]
    assert (d["delta"], d["O"], d["T"], d["G"]) == ("5/14", "5/14", "0", "0")
    assert '-    "hard dev 0": "HARD DEV 0",' in str(scaled["diff"])
    report = scaled["report"]
    assert report.verified, json.dumps(report.as_json(), indent=1)  # type: ignore[attr-defined]
