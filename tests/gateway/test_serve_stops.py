"""A ``holedger serve`` whose event writer cannot write still stops on SIGTERM.

The serve runs on a PostgreSQL ledger; once a call has been served, the events table is
taken away under it, so every write fails at once. The gateway then fails closed (503
``ledger_unavailable``), and SIGTERM still ends the process: shutting down does not wait
for a writer that is failing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from pgdb import fresh_database, pg_conninfo

from .helpers import SIM_MODEL, digest, make_terms

HOLEDGER = (sys.executable, "-m", "holedger")
SERVE_ARGS = ("--port", "0", "--gateway-port", "0", "--json")
BODY = json.dumps(
    {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
).encode()


# A hang guard, not a speed claim: a serve that waited for its failing writer took over
# a minute (each wait 30 s) before this was fixed.
STOP_WITHIN_S = 40


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_database("holedger_serve_stops")


@pytest.mark.postgres
def test_serve_with_a_failed_writer_stops_on_sigterm(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    from holedger.cli import cli
    from holedger.config import Settings
    from holedger.gateway.tokens import TokenRegistry
    from holedger.ledger.store import Ledger

    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), "--ledger", pg_url, "init"])
    assert result.exit_code == 0, result.output
    ledger = Ledger.from_settings(Settings.resolve(str(home), pg_url))
    run_id = ledger.open_run(make_terms(), task_digest=digest("task"))
    token = TokenRegistry(ledger.app.engine).issue_optimizer_token(run_id)
    ledger.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "holedger",
            "--home",
            str(home),
            "--ledger",
            pg_url,
            "serve",
            "--port",
            "0",
            "--gateway-port",
            "0",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["gateway"][0] + "/chat/completions"
        headers = {"authorization": f"Bearer {token}"}
        assert httpx.post(url, content=BODY, headers=headers, timeout=30).status_code == 200
        with psycopg.connect(pg_conninfo(pg_url), autocommit=True) as conn:
            conn.execute("ALTER TABLE holedger_events RENAME TO holedger_events_gone")
        statuses = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # answered, then its event cannot be written
            resp = httpx.post(url, content=BODY, headers=headers, timeout=30)
            statuses.append(resp.status_code)
            if resp.status_code == 503:
                assert resp.json()["error"]["code"] == "ledger_unavailable"
                break
            time.sleep(0.2)
        assert statuses[-1] == 503, statuses  # the writer has failed: it fails closed
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail("holedger serve did not stop on SIGTERM with a failed writer")
        assert proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
