"""The optimizer API an author needs, used by a program that knows only HTTP.

`http_only_optimizer.py` imports nothing of holedger (standard library only, run in
isolated mode): it reads the seed's tree and files, commits changes on top of a parent
(and on top of its own candidate), is refused an immutable path with the rule named,
reads its budget per component, evaluates, and nominates; the run then verifies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from holedger.gateway.serve import AppServer
from holedger.protocol.tokens import DEFAULT_OPTIMIZER_TOKENS
from holedger.server.api import create_api_app
from holedger.server.lifecycle import abort_run
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies

PROGRAM = Path(__file__).with_name("http_only_optimizer.py")


@pytest.fixture(scope="module")
def api(service: RunService) -> Iterator[AppServer]:
    server = AppServer(create_api_app(service), host="127.0.0.1", port=0)
    server.start()
    yield server
    server.stop()


def test_the_program_imports_nothing_of_holedger() -> None:
    source = PROGRAM.read_text()
    assert "import holedger" not in source and "from holedger" not in source


def test_an_author_reads_commits_changes_reads_the_budget_and_nominates(
    api: AppServer, service: RunService, tiny: ServerTask, tmp_path: Path
) -> None:
    opened = service.open_run("tiny", optimizer="http-only")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOLEDGER_API_URL": f"http://127.0.0.1:{api.port}/v1/runs/{opened.run_id}",
        "HOLEDGER_API_TOKEN": opened.optimizer_token,
    }
    done = subprocess.run(
        [sys.executable, "-I", str(PROGRAM)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert not seen["holedger_imported"]

    # The seed's files: sizes as the task's seed folder has them, the immutable one marked.
    seed_files = {
        p.relative_to(tiny.seed_dir).as_posix(): p.stat().st_size
        for p in tiny.seed_dir.rglob("*")
        if p.is_file()
    }
    assert {p: v[0] for p, v in seen["listing"].items()} == seed_files
    assert {p for p, v in seen["listing"].items() if v[1]} == {"rules/policy.txt"}
    assert seen["seed_main_matches"]
    assert seen["missing_file"] == [404, "not_found"]

    # Changes on a parent: only what changed, on the parent named.
    assert seen["first"] == {"parent": opened.seed_commit, "changed_paths": ["harness/__main__.py"]}
    first = service.candidate_info(opened.run_id, "seed")  # the seed stays the seed
    assert first.index == 0
    assert seen["second"]["changed_paths"] == ["harness/__init__.py", "notes.txt"]
    assert seen["second_files"] == ["harness/__main__.py", "notes.txt", "rules/policy.txt"]

    # Refusals that name the rule, and say what happened.
    status, message, hint = seen["immutable_change"]
    assert status == 409
    assert "changes rules/policy.txt under the immutable path 'rules'" in message
    status, message, hint = seen["immutable_left_out"]
    assert status == 409
    assert "removes rules/policy.txt under the immutable path 'rules'" in message
    assert "whole tree" in hint and "changes" in hint

    # The budget, per component, before and after one dev request of one case.
    assert seen["components"] == [
        "dev calls",
        "dev case_passes",
        "val calls",
        "val case_passes",
        "target tokens",
        "optimizer tokens",
    ]
    before, after = seen["budget_before"], seen["budget_after"]
    assert before["dev"] == {"calls": 100, "case_passes": "4"}
    assert after["dev"] == {"calls": 99, "case_passes": "23/6"}
    assert before["target_tokens"] == after["target_tokens"] == 100000  # no model calls
    assert after["optimizer_tokens"] == DEFAULT_OPTIMIZER_TOKENS  # the default cap, unused
    assert seen["info_budget"] == after
    assert seen["dev_score"] == "1"

    # An unknown route gets the documented JSON error.
    status, body = seen["unknown_route"]
    assert status == 404 and body["error"]["type"] == "not_found"
    assert seen["nominated"]
    assert_replay_verifies(service.ledger, opened.run_id)


def test_a_commit_is_files_or_changes_not_both(
    api: AppServer, service: RunService, tiny: ServerTask
) -> None:
    opened = service.open_run("tiny", baseline=False)
    base = f"http://127.0.0.1:{api.port}/v1/runs/{opened.run_id}"
    headers = {"authorization": f"Bearer {opened.optimizer_token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        both = http.post("/candidates", json={"files": {}, "changes": {}})
        assert both.status_code == 400 and "either" in both.json()["error"]["message"]
        gone = http.post("/candidates", json={"changes": {"nothing.py": None}})
        assert gone.status_code == 400 and "nothing.py" in gone.json()["error"]["message"]
        wrong = http.delete("/budget")
        assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"
        outside = httpx.get(f"http://127.0.0.1:{api.port}/v2/anything")
        assert outside.status_code == 404 and outside.json()["error"]["type"] == "not_found"
    # A run with no seed baseline can never be scored: close it, so the shared home holds
    # no run that other tests would try to nominate.
    abort_run(service, opened.run_id, "a test of refusals only")
    assert_replay_verifies(service.ledger, opened.run_id)
