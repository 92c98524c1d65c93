"""Every `holedger` command starts by building the whole command line (each room registers
its commands), so what the command modules import at their top is paid by every command,
`holedger --help` included. The database, bundle verification, audit bundles, the HTTP
client and git load only when a command that needs them runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOADED_WHEN_USED = (
    "sqlalchemy",
    "eventsourcing",
    "pygit2",
    "httpx",
    "holedger.ledger.store",
    "holedger.replay.runs",
    "holedger.bundles.export",
    "holedger.bundles.verify",
    "holedger.audit.bundle",
    "holedger.gateway.doctor",
)


def modules_after_start() -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = "import json, sys, holedger.cli; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


def test_building_the_command_line_loads_no_database_bundle_or_http_code() -> None:
    loaded = modules_after_start()
    assert "holedger.cli" in loaded and "holedger.audit.commands" in loaded
    assert sorted(m for m in LOADED_WHEN_USED if m in loaded) == []


def test_the_lazy_hooks_are_registered_and_reach_their_modules() -> None:
    """The audits attachment and the doctor's upstreams section are registered at start
    and load their code when called."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = (
        "import sys, holedger.cli\n"
        "from holedger.bundles.attachments import REGISTRY\n"
        "from holedger.sandboxes.commands import DOCTOR_SECTIONS\n"
        "audits = REGISTRY['audits']\n"
        "verdict = audits.verify(b'not an audits bundle', 'r', [])\n"
        "print(bool(verdict.problems), 'holedger.audit.bundle' in sys.modules)\n"
        "print(any(s.__name__ == 'upstreams_section' for s in DOCTOR_SECTIONS))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"]
