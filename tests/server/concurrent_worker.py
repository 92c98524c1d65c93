"""A separate process evaluating against a shared ledger (for the concurrency test).

Usage: python -m tests.server.concurrent_worker HOME TASK_ROOT RUN_ID CASE_ID
Prints "accepted" or "rejected".
"""

from __future__ import annotations

import sys
from pathlib import Path

# tests/ is where pytest finds the shared test helpers; this process starts outside pytest
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holedger.config import Settings
from holedger.errors import BudgetExceededError
from holedger.ledger.store import Ledger
from holedger.server.service import RunService, ServerConfig

from .tinytask import make_task


def main() -> None:
    home, task_root, run_id, case_id = sys.argv[1:5]
    settings = Settings.resolve(home)
    root = Path(task_root)
    task = make_task(root, dev_calls=int(sys.argv[5]), seed=root / "seed")
    ledger = Ledger.from_settings(settings)
    service = RunService(
        settings,
        ledger,
        ServerConfig(gateway=None, task_loader=lambda r: task, default_backend="process"),
    )
    try:
        service.evaluate(run_id, "seed", "dev", [case_id], 1)
        print("accepted")
    except BudgetExceededError:
        print("rejected")
    finally:
        ledger.close()


if __name__ == "__main__":
    main()
