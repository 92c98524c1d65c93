"""A separate process evaluating the model task, whose harness waits after its model
call: the recovery test kills it while the trial runs.

Usage: python -m tests.server.model_worker HOME TASK_ROOT RUN_ID WAIT_S
"""

from __future__ import annotations

import sys
from pathlib import Path

# tests/ is where pytest finds the shared test helpers; this process starts outside pytest
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.server.gateway_link import GatewayLink
from holedger.server.service import RunService, ServerConfig

from .tinytask import model_task


def main() -> None:
    home, task_root, run_id, wait_s = sys.argv[1:5]
    settings = Settings.resolve(home)
    task = model_task(Path(task_root), wait_s=float(wait_s))
    ledger = Ledger.from_settings(settings)
    link = GatewayLink(ledger)
    service = RunService(
        settings,
        ledger,
        ServerConfig(gateway=link, task_loader=lambda r: task, default_backend="process"),
    )
    try:
        service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-2"], 1)
        print("evaluated")
    finally:
        link.close()
        ledger.close()


if __name__ == "__main__":
    main()
