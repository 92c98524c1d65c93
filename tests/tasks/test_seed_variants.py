"""officeqa-lite's seed variants (the anthropic SDK, the Responses API) run as trials do:
``python3 -m harness`` on the curated harness runtime alone (no site-packages), the SDK
finding the gateway in the environment a sandbox sets, every call metered and recorded in
the variant's wire format and attributed to its trial."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sample_terms import task_terms

from holedger.gateway.app import create_gateway_app
from holedger.gateway.serve import serve_gateway
from holedger.gateway.tokens import TokenRegistry
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run
from holedger.sandboxes.runtime import build_runtime
from holedger.schemas.events import GatewayCall
from holedger.tasks import load_task
from holedger.tasks.variants import seed_variants, write_variant

TASK = load_task("officeqa-lite")
FORMATS = {"anthropic-sdk": "/v1/messages", "responses-api": "/v1/responses"}


def test_the_task_ships_both_variants() -> None:
    assert seed_variants(TASK.root) == sorted(FORMATS)


@pytest.mark.parametrize("variant", sorted(FORMATS))
def test_a_variant_runs_as_a_trial_through_the_gateway(tmp_path: Path, variant: str) -> None:
    tree = write_variant(TASK.root, TASK.seed_dir, variant, tmp_path / "candidate")
    assert (tree / "corpus").is_dir() and (tree / "harness" / "__main__.py").is_file()
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("variants"))
    terms = task_terms("officeqa-lite", models=["holedger-sim-1"], immutable_paths=[])
    run_id = ledger.open_run(terms, task_digest=hashlib.sha256(b"task").hexdigest())
    tokens = TokenRegistry(ledger.app.engine)
    gateway = create_gateway_app(ledger, tokens)
    server = serve_gateway(gateway)
    runtime = build_runtime()
    try:
        answered = 0
        for n, case in enumerate(TASK.cases("dev")[:3]):
            trial = f"t{n}"
            token = tokens.issue_trial_token(
                run_id, request_id="r", trial_id=trial, case_id=case.id, attempt=0
            )
            env = {  # what a sandbox sets, and only the curated runtime to import from
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(runtime),
                "HOLEDGER_MODEL": "holedger-sim-1",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": token,
                "ANTHROPIC_BASE_URL": server.base_url.removesuffix("/v1"),
                "ANTHROPIC_API_KEY": token,
            }
            done = subprocess.run(
                [sys.executable, "-S", "-m", "harness"],
                cwd=tree,
                input=json.dumps(case.input),
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            usage = gateway.close_trial(run_id, trial)
            if done.returncode != 0:
                # The seed retries nothing: a simulated transient error ends the trial.
                assert "500" in done.stderr or "502" in done.stderr or "503" in done.stderr
                continue
            answered += 1
            assert "answer" in json.loads(done.stdout.strip().splitlines()[-1])
            assert usage.calls >= 1 and usage.tokens.total > 0
        assert answered >= 2
        gateway.flush()
        calls = [r.typed_payload() for r in ledger.records(run_id) if r.type == "GatewayCall"]
        assert calls and all(
            isinstance(c, GatewayCall) and c.endpoint == FORMATS[variant] for c in calls
        )
        assert any(c.status == 200 and c.tokens.total > 0 for c in calls)  # type: ignore[union-attr]
        ledger.close_run(run_id)
        report = replay_run(ledger, run_id, checks=[GatewayFold])
        assert report.verified, report.failed_checks()
    finally:
        server.stop()
        gateway.close()
        ledger.close()
