"""A whole run whose harness writes through /proc/1/fd/1 and asks for a DNS name made of
escape sequences, on each isolating backend: contained, recorded (escaped), and the run
still verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.server.service import RunService, ServerConfig
from holedger.untrusted import is_safe

from .helpers import assert_replay_verifies
from .tinytask import make_task, write_seed

pytestmark = pytest.mark.slow

HOSTILE_MAIN = r"""import json, os, socket, struct, sys
case = json.loads(sys.stdin.read())
print(json.dumps({"answer": case["q"].upper()}), flush=True)
name = b"\x1b[2J\x1b]0;pwned\x07"
query = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
query += bytes([len(name)]) + name + b"\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
s.sendto(query, ("127.0.0.1", 53))
try:
    s.recv(512)
except OSError:
    pass
fd = os.open("/proc/1/fd/1", os.O_WRONLY)
for _ in range(64):
    os.write(fd, b"x" * (1 << 20))
"""


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_a_hostile_harness_is_contained_recorded_and_the_run_verifies(
    backend: str, fresh_home: Settings, tmp_path: Path
) -> None:
    from holedger.sandboxes.registry import backend as named

    ok, why = named(backend).available()
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {why}")
    seed = write_seed(tmp_path / "task")
    (seed / "harness" / "__main__.py").write_text(HOSTILE_MAIN)
    task = make_task(tmp_path / "task", k=1, seed=seed)
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(
        fresh_home,
        ledger,
        ServerConfig(gateway=None, task_loader=lambda r: task, default_backend=backend),
    )
    try:
        run_id = service.open_run("tiny").run_id
        service.evaluate(run_id, "seed", "dev", ["dev-0", "dev-1"], 1)
        service.nominate(run_id, "seed")
        assert_replay_verifies(ledger, run_id)
        violations = [r.payload for r in ledger.records(run_id) if r.type == "SafetyViolation"]
    finally:
        service.close()
        ledger.close()
    categories = {v["category"] for v in violations}
    # docker: the entrypoint's stdout is a tripwire; bwrap: it is the trial's own output
    assert ("host_write" if backend == "docker" else "output_truncated") in categories
    dns = [v["detail"] for v in violations if v["detail"].startswith("dns query for")]
    assert dns and all("\\x1b[2J\\x1b]0;pwned\\x07" in d for d in dns)
    assert all(is_safe(v["detail"]) for v in violations)
