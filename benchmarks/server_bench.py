"""Server overheads, printed side by side from one run.

    python benchmarks/server_bench.py [--trials N] [--workers W] [--backend NAME]

Figures:

1. the budget gate: decisions per second (fold + rules + signed append) for requests that
   are rejected (no trials run), one thread and ``--workers`` threads racing on one run;
2. one evaluation of N trials through the server (checkout, sandbox, verifier, blobs,
   events, projection) next to N bare sandbox runs of the same harness, as a ratio;
3. a candidate commit (read, checks, pygit2 tree and commit, signed event) per second.

Uses a throwaway home and a tiny upper-casing task that needs no model. Figures vary with
machine load; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from holedger.config import Settings  # noqa: E402
from holedger.errors import BudgetExceededError  # noqa: E402
from holedger.ledger.store import Ledger  # noqa: E402
from holedger.sandboxes import Limits, SandboxSpec, get_backend  # noqa: E402
from holedger.server.candidates import FileEntry, read_directory  # noqa: E402
from holedger.server.service import RunService, ServerConfig  # noqa: E402
from tests.server.tinytask import CASES, make_task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gate-requests", type=int, default=200)
    parser.add_argument("--backend", default="process")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="holedger-server-bench-"))
    settings = Settings.resolve(tmp / "home")
    Ledger.init_home(settings)
    task = make_task(tmp / "task", dev_calls=1)
    ledger = Ledger.from_settings(settings)
    service = RunService(
        settings,
        ledger,
        ServerConfig(
            gateway=None,
            task_loader=lambda ref: task,
            default_backend=args.backend,
            workers=args.workers,
        ),
    )
    run_id = service.open_run("tiny").run_id
    service.evaluate(run_id, "seed", "dev", ["dev-0"], 1)  # the dev calls budget is spent

    def reject(_: int) -> None:
        try:
            service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
        except BudgetExceededError:
            return
        raise AssertionError("the gate accepted an over-budget request")

    n = args.gate_requests
    t0 = time.perf_counter()
    for i in range(n):
        reject(i)
    one = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(reject, range(n)))
    many = n / (time.perf_counter() - t0)
    print(f"budget gate, rejected requests   1 thread {one:8.1f}/s   4 threads {many:8.1f}/s")

    # 2. evaluation overhead against bare sandbox runs
    run2 = service.open_run("tiny").run_id
    cases = (CASES["val"] * ((args.trials // len(CASES["val"])) + 1))[: args.trials]
    ids = sorted(set(cases))
    attempts = max(1, args.trials // len(ids))
    t0 = time.perf_counter()
    service.evaluate(run2, "seed", "val", ids, attempts)
    served = time.perf_counter() - t0
    trials = len(ids) * attempts
    backend = get_backend(args.backend)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        list(
            pool.map(
                lambda _: backend.run(
                    SandboxSpec(
                        code_dir=task.seed_dir,
                        argv=["python3", "-m", "harness"],
                        stdin=b'{"q": "easy"}\n',
                        limits=Limits(wall_s=20),
                    )
                ),
                range(trials),
            )
        )
    bare = time.perf_counter() - t0
    print(
        f"evaluation of {trials} trials ({args.backend}, {args.workers} workers)   "
        f"server {served:6.2f}s   bare sandbox {bare:6.2f}s   ratio {served / bare:5.2f}"
    )

    # 3. candidate commits
    base = read_directory(task.seed_dir)
    count = 30
    t0 = time.perf_counter()
    for i in range(count):
        files = dict(base)
        files["harness/extra.py"] = FileEntry(f"X = {i}\n".encode())
        service.commit_candidate(run2, files)
    print(f"candidate commits                {count / (time.perf_counter() - t0):8.1f}/s")
    service.close()
    ledger.close()


if __name__ == "__main__":
    main()
