"""The budget gate is atomic: parallel requests against a nearly spent budget never overspend."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from holedger.config import Settings
from holedger.errors import BudgetExceededError
from holedger.ledger.store import Ledger
from holedger.server.service import RunService, ServerConfig

from .helpers import assert_replay_verifies, independent_budget_count
from .tinytask import CASES, make_task

REPO = Path(__file__).resolve().parents[2]


def _service(home: Settings, task_root: Path, dev_calls: int) -> RunService:
    task = make_task(task_root, dev_calls=dev_calls)
    return RunService(
        home,
        Ledger.from_settings(home),
        ServerConfig(gateway=None, task_loader=lambda r: task, default_backend="process"),
    )


def test_parallel_threads_never_overspend(fresh_home: Settings, tmp_path: Path) -> None:
    service = _service(fresh_home, tmp_path / "task", dev_calls=4)
    try:
        run_id = service.open_run("tiny").run_id
        service.evaluate(run_id, "seed", "dev", ["dev-0"], 1)  # 3 calls left

        def request(case_id: str) -> str:
            try:
                service.evaluate(run_id, "seed", "dev", [case_id], 1)
                return "accepted"
            except BudgetExceededError:
                return "rejected"

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(request, CASES["dev"] * 2))
        assert results.count("accepted") == 3
        assert results.count("rejected") == len(results) - 3
        counted = independent_budget_count(service.ledger, run_id)
        assert counted["calls"]["dev"] == 4
        assert counted["decisions"] == {"accepted": 4, "rejected": len(results) - 3}
        service.nominate(run_id, "seed")
        assert_replay_verifies(service.ledger, run_id)
    finally:
        service.close()
        service.ledger.close()


def test_parallel_processes_never_overspend(fresh_home: Settings, tmp_path: Path) -> None:
    task_root = tmp_path / "task"
    service = _service(fresh_home, task_root, dev_calls=3)
    try:
        run_id = service.open_run("tiny").run_id
        service.evaluate(run_id, "seed", "dev", ["dev-0"], 1)  # 2 calls left
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.server.concurrent_worker",
                    str(fresh_home.home),
                    str(task_root),
                    run_id,
                    case_id,
                    "3",
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for case_id in CASES["dev"]
        ]
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-2000:]
            outputs.append(out.strip())
        assert outputs.count("accepted") == 2, outputs
        assert outputs.count("rejected") == len(procs) - 2
        counted = independent_budget_count(service.ledger, run_id)
        assert counted["calls"]["dev"] == 3
        service.nominate(run_id, "seed")
        assert_replay_verifies(service.ledger, run_id)
    finally:
        service.close()
        service.ledger.close()
