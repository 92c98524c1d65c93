"""What a demo leaves for its user once the example optimizer has run, interrupted or not:
the optimizer's log kept beside the run's report, and the command that replays the run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from holedger.config import Settings

if TYPE_CHECKING:
    from holedger.sandboxes.spec import SandboxResult


def parse_log(stdout: bytes) -> list[dict[str, Any]]:
    """The optimizer's log: one JSON object per line of its stdout (other lines skipped)."""
    entries = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
    return entries


def save_optimizer_log(cfg: Settings, run_id: str, result: SandboxResult) -> Path:
    """The optimizer's log (its stdout, one JSON object a line) and its stderr, kept
    beside the run's report."""
    cfg.reports_dir.mkdir(parents=True, exist_ok=True)
    log_path = cfg.reports_dir / f"{run_id}.optimizer.jsonl"
    log = parse_log(result.stdout)
    log_path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in log))
    (cfg.reports_dir / f"{run_id}.optimizer.stderr.txt").write_bytes(result.stderr)
    return log_path


def replay_command(cfg: Settings, run_id: str) -> str:
    """The command that replays ``run_id`` from this home and ledger, as the user types it
    (the home and ledger named only where they are not the defaults)."""
    parts = ["holedger"]
    if cfg.home != Settings.resolve(".holedger").home:
        parts += ["--home", shlex.quote(str(cfg.home))]
    if cfg.ledger_url != Settings.resolve(cfg.home).ledger_url:
        parts += ["--ledger", shlex.quote(cfg.ledger_url)]
    parts += ["replay", run_id]
    return " ".join(parts)
