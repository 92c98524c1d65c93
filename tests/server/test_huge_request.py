"""One request cannot stop the gateway: max_tokens = 2**64 from a trial and from the
optimizer's scope, while another run keeps calling.

Two runs share one gateway (as under ``holedger serve``). In run A a candidate's harness
sends a chat request with max_tokens = 2**64 (then its ordinary call) in each trial, and
the optimizer's token sends the same; meanwhile run B evaluates, its trials calling the
model. The huge requests are refused 400 naming the field and recorded; every other call
of both runs succeeds; the writer never fails; both runs are nominated, closed, and
verify on replay.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from holedger.config import Settings
from holedger.gateway.limits import MAX_OUTPUT_TOKENS
from holedger.ledger.store import Ledger
from holedger.server.gateway_link import GatewayLink
from holedger.server.service import RunService, ServerConfig

from .helpers import assert_replay_verifies, candidate_with_main
from .tinytask import MODEL_MAIN, model_task

HUGE = 2**64
HUGE_FIRST = """import json as _j, os as _o, urllib.error as _e, urllib.request as _r
_body = _j.dumps({"model": _o.environ["HOLEDGER_MODEL"], "max_tokens": 2**64,
                  "messages": [{"role": "user", "content": "everything"}]}).encode()
try:
    _r.urlopen(_r.Request(_o.environ["OPENAI_BASE_URL"] + "/chat/completions", data=_body,
        headers={"authorization": "Bearer " + _o.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"}), timeout=30)
    print("huge request accepted", file=__import__("sys").stderr)
except _e.HTTPError as _x:
    print("huge request refused", _x.code, file=__import__("sys").stderr)
""" + MODEL_MAIN.replace("WAIT_S", "0")


@pytest.mark.slow
def test_a_huge_max_tokens_stops_nothing(fresh_home: Settings, tmp_path: Path) -> None:
    task = model_task(tmp_path / "task")
    ledger = Ledger.from_settings(fresh_home)
    link = GatewayLink(ledger)
    service = RunService(
        fresh_home,
        ledger,
        ServerConfig(gateway=link, task_loader=lambda r: task, default_backend="process"),
    )
    try:
        opened_a = service.open_run("model")
        run_a, run_b = opened_a.run_id, service.open_run("model").run_id
        huge = candidate_with_main(service, run_a, task, HUGE_FIRST)
        gateway_socket = link.server.urls[0].removeprefix("unix:")
        optimizer = httpx.Client(transport=httpx.HTTPTransport(uds=gateway_socket), timeout=30)
        body = {"model": "holedger-sim-1", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {opened_a.optimizer_token}"}
        url = "http://gateway/v1/chat/completions"

        errors: list[BaseException] = []

        def run_b_keeps_calling() -> None:
            try:
                for _ in range(2):
                    service.evaluate(run_b, "seed", "dev", ["dev-1", "dev-2"], 1)
            except BaseException as exc:  # reported below
                errors.append(exc)

        other = threading.Thread(target=run_b_keeps_calling)
        other.start()
        refused = optimizer.post(url, json={**body, "max_tokens": HUGE}, headers=headers)
        evaluated = service.evaluate(run_a, huge, "dev", ["dev-1", "dev-2"], 1)
        ordinary = optimizer.post(url, json={**body, "max_tokens": 16}, headers=headers)
        other.join()
        assert not errors, errors
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "max_tokens"
        assert str(MAX_OUTPUT_TOKENS) in refused.json()["error"]["message"]
        assert ordinary.status_code == 200
        assert evaluated.projection["cases"]["dev-1"]["mean"] == "1"
        assert link.gateway.writer.failure is None

        calls_a = [r.payload for r in ledger.records(run_a) if r.type == "GatewayCall"]
        huge_calls = [c for c in calls_a if c["code"] == "invalid_request"]
        assert len(huge_calls) == 3  # two trials and the optimizer, each refused, recorded
        assert all(not c["allowed"] and c["reserved"] == 0 for c in huge_calls)
        trial_ok = [c for c in calls_a if c["trial_id"] and c["status"] == 200]
        assert len(trial_ok) >= 2  # each trial's ordinary call went through
        calls_b = [r.payload for r in ledger.records(run_b) if r.type == "GatewayCall"]
        assert len([c for c in calls_b if c["status"] == 200]) >= 4

        service.nominate(run_a, huge)
        service.nominate(run_b, "seed")
        for run_id in (run_a, run_b):
            assert_replay_verifies(ledger, run_id)
        optimizer.close()
    finally:
        service.close()
        link.close()
        ledger.close()
