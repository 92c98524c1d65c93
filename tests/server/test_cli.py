"""The command line: `holedger serve` as a real process; one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger

from .helpers import cli_invoker
from .tinytask import PERFECT_MAIN, write_seed, write_task_folder

REPO = Path(__file__).resolve().parents[2]


def _serve(home: Settings, *extra: str) -> subprocess.Popen[str]:
    """`holedger serve --json` on free ports as a real process; its first line is its URLs."""
    serve = ["serve", "--port", "0", "--gateway-port", "0", "--json", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "holedger.cli", "--home", str(home.home), *serve],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_serve_prints_its_urls_and_answers(fresh_home: Settings, tmp_path: Path) -> None:
    sock = tmp_path / "api.sock"
    proc = _serve(fresh_home, "--socket", str(sock))
    try:
        assert proc.stdout is not None
        urls = json.loads(proc.stdout.readline())
        api = next(u for u in urls["api"] if u.startswith("http"))
        assert f"unix:{sock}" in urls["api"]
        assert any(u.startswith("http") for u in urls["gateway"])
        assert httpx.get(f"{api}/healthz", timeout=10).json() == {"ok": True}
        nobody = httpx.get(f"{api}/v1/runs/00000000-0000-4000-8000-000000000000", timeout=10)
        assert nobody.status_code == 401
        gateway = next(u for u in urls["gateway"] if u.startswith("http"))
        models = httpx.get(f"{gateway}/models", timeout=10)
        assert models.status_code == 401  # the gateway wants a token too
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_errors_are_one_line_with_a_hint(fresh_home: Settings) -> None:
    runner = CliRunner()
    home = ["--home", str(fresh_home.home)]
    result = runner.invoke(cli, [*home, "eval", "ffff0000", "seed", "--split", "dev"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("holedger: error: no run ffff0000")
    result = runner.invoke(cli, [*home, "nominate", "ab", "seed", "--json"])
    assert result.exit_code == 2 and "at least 4 characters" in result.output
    result = runner.invoke(cli, [*home, "run", "open", "--task", "x", "--backend", "nosuch"])
    assert result.exit_code == 2 and "'bwrap', 'docker', 'process'" in result.output


def test_a_whole_run_from_the_command_line(fresh_home: Settings, tmp_path: Path) -> None:
    """A task folder loaded by holedger.tasks, driven only through the CLI."""
    task_dir = write_task_folder(tmp_path / "task")
    runner = CliRunner()
    home = ["--home", str(fresh_home.home)]
    invoke = cli_invoker(fresh_home)

    def run(*args: str) -> Any:
        return json.loads(invoke(*args))

    opened = run(
        "run",
        "open",
        "--task",
        str(task_dir),
        "--optimizer",
        "cli",
        "--backend",
        "process",
        "--json",
    )
    run_id = opened["run_id"]
    assert opened["backend"] == "process"
    assert opened["task_id"] == "tiny-folder"
    assert opened["seed_baseline"]["e_h0"] == 0.5
    assert opened["seed_baseline"]["e_h0_exact"] == "0.5"
    assert opened["optimizer_token"].startswith("hlg_")
    folder = write_seed(tmp_path / "cand")
    (folder / "harness" / "__main__.py").write_text(PERFECT_MAIN)
    committed = run("candidate", "commit", run_id[:8], str(folder), "--json")
    assert committed["index"] == 1 and committed["changed_paths"] == ["harness/__main__.py"]
    evaluated = run(
        "eval",
        run_id[:8],
        committed["candidate"][:7],
        "--split",
        "dev",
        "--cases",
        "dev-0,dev-1",
        "--attempts",
        "2",
        "--json",
    )
    assert evaluated["projection"]["cases"]["dev-0"]["mean"] == "1"
    assert evaluated["budget_used"]["dev"] == {
        "calls": 1,
        "case_passes": 2 / 3,
        "case_passes_exact": "2/3",
    }
    assert evaluated["cost"]["case_passes"] == 2 / 3
    assert evaluated["cost"]["case_passes_exact"] == "2/3"
    refused = runner.invoke(cli, [*home, "eval", run_id, "seed", "--split", "test"])
    assert refused.exit_code == 3
    assert refused.output.count("\n") == 1 and "test split is closed" in refused.output
    scored = run("nominate", run_id, committed["candidate"], "--json")
    assert (scored["e_h_plus"], scored["e_h0"], scored["g"]) == (1.0, 0.5, 1.0)
    assert (scored["e_h_plus_exact"], scored["e_h0_exact"], scored["g_exact"]) == ("1", "0.5", "1")
    assert scored["cases"] * scored["k"] == scored["trials"]
    again = runner.invoke(cli, [*home, "nominate", run_id, "seed"])
    assert again.exit_code == 3 and "already has a nomination" in again.output
    replayed = runner.invoke(cli, [*home, "replay", run_id, "--json"])
    assert replayed.exit_code == 0, replayed.output

    # A third party verifies the bundle of a run on a task of its own: the leakage audit
    # needs that task, given with --task (holedger does not bundle it).
    bundle = tmp_path / "run.hlb"
    run("export", run_id, "-o", str(bundle), "--json")
    elsewhere = ["--home", str(tmp_path / "nowhere")]

    def verified(*extra: str) -> dict[str, Any]:
        result = runner.invoke(cli, [*elsewhere, "verify", str(bundle), "--json", *extra])
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.output))

    assert verified()["leakage"]["audit"]["status"] == "skipped"
    assert verified()["rescored"]["status"] == "skipped"
    with_task = verified("--task", str(task_dir))
    audited = with_task["leakage"]["audit"]
    assert audited["status"] == "done" and audited["findings"] == []
    # Every trial's recorded score is what the task's own verifier gives its answer.
    trials = with_task["safety"]["trials"]
    assert with_task["rescored"] == {"status": "done", "rescored": trials, "not_rescored": 0}


CRASHING_MAIN = """import json, sys
q = json.loads(sys.stdin.read())["q"]
if q.startswith("hard"):
    sys.exit(3)
print(json.dumps({"answer": q.upper()}))
"""


def test_eval_says_why_trials_scored_nothing(fresh_home: Settings, tmp_path: Path) -> None:
    """A score of 0 alone hides a crash: eval warns, on stderr and in --json."""
    task_dir = write_task_folder(tmp_path / "task")
    runner = CliRunner()
    home = ["--home", str(fresh_home.home)]
    opened = runner.invoke(
        cli, [*home, "run", "open", "--task", str(task_dir), "--backend", "process", "--json"]
    )
    run_id = json.loads(opened.output)["run_id"]
    folder = write_seed(tmp_path / "cand")
    (folder / "harness" / "__main__.py").write_text(CRASHING_MAIN)
    committed = runner.invoke(cli, [*home, "candidate", "commit", run_id, str(folder), "--json"])
    candidate = json.loads(committed.output)["candidate"]
    result = runner.invoke(cli, [*home, "eval", run_id, candidate, "--split", "dev"])
    assert result.exit_code == 0, result.output
    # dev-0 and dev-3 are the "hard" questions of the six.
    assert "warning: 2 of 6 trials gave no answer: exit status 3 (2)" in result.stderr
    assert "warning" not in result.stdout
    seed = runner.invoke(
        cli, [*home, "eval", run_id, "seed", "--split", "dev", "--cases", "dev-1", "--json"]
    )
    assert json.loads(seed.output)["warnings"] == []
    again = runner.invoke(
        cli, [*home, "eval", run_id, candidate, "--split", "dev", "--cases", "dev-3", "--json"]
    )
    assert json.loads(again.stdout)["warnings"] == [
        "1 of 1 trials gave no answer: exit status 3 (1)"
    ]
    assert again.stderr == "warning: 1 of 1 trials gave no answer: exit status 3 (1)\n"
    # val discloses its aggregate mean only: three of its cases crash, and nothing says so.
    val = runner.invoke(cli, [*home, "eval", run_id, candidate, "--split", "val"])
    assert val.exit_code == 0, val.output
    assert "mean 0.625: 5 of 8 trials over 8 cases" in val.stdout and not val.stderr


SLOW_MAIN = """import json, sys, time
q = json.loads(sys.stdin.read())["q"]
time.sleep(1.5)
print(json.dumps({"answer": q.upper()}))
"""


def test_serve_stopped_mid_evaluation_records_it_whole(
    fresh_home: Settings, tmp_path: Path
) -> None:
    """SIGTERM while an evaluation runs: serve waits for it to be recorded, then exits."""
    task_dir = write_task_folder(tmp_path / "task")
    runner = CliRunner()
    home = ["--home", str(fresh_home.home)]
    opened = runner.invoke(
        cli, [*home, "run", "open", "--task", str(task_dir), "--backend", "process", "--json"]
    )
    assert opened.exit_code == 0, opened.output
    run = json.loads(opened.output)
    folder = write_seed(tmp_path / "cand")
    (folder / "harness" / "__main__.py").write_text(SLOW_MAIN)
    made = runner.invoke(cli, [*home, "candidate", "commit", run["run_id"], str(folder), "--json"])
    candidate = json.loads(made.output)["candidate"]
    ledger = Ledger.from_settings(fresh_home)
    proc = _serve(fresh_home)
    try:
        assert proc.stdout is not None
        api = next(u for u in json.loads(proc.stdout.readline())["api"] if u.startswith("http"))
        answer: list[httpx.Response] = []
        body = {"candidate": candidate, "split": "dev", "case_ids": ["dev-1"]}
        call = threading.Thread(
            target=lambda: answer.append(
                httpx.post(
                    f"{api}/v1/runs/{run['run_id']}/evaluations",
                    json=body,
                    headers={"authorization": f"Bearer {run['optimizer_token']}"},
                    timeout=60,
                )
            )
        )
        call.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(  # the request is in, its trial runs
            r.type == "EvaluationRequested" for r in ledger.records(run["run_id"])
        ):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        call.join(timeout=60)
        # Stopping closes the API and the gateway servers, each given up to 15 s to let
        # their connections go, and the sandbox janitor: on a loaded machine it can take
        # a while, so the wait is generous.
        _, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err
        assert "waiting for 1 evaluation or nomination in flight" in err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answer and answer[0].status_code == 200, answer
    replayed = runner.invoke(cli, [*home, "replay", run["run_id"], "--json"])
    failures = json.loads(replayed.output)["failures"]
    assert not any("no projection" in f["reason"] for f in failures), failures
    types = [r.type for r in ledger.records(run["run_id"])]
    assert types[-1] == "DisclosureProjected"
    ledger.close()
