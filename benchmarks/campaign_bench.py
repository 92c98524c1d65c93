"""What `holedger campaign run --example` takes: wall time, CPU time and where it goes.

Runs the bundled offline grid in a new temporary home (or ``--home``), as a user would
(`python -m holedger campaign run --example --json`), then reads the ledger: per run the
dev, val and held-out trials and the harness CPU they took, and the seed baseline's.

CPU is counted in two parts, side by side:

* the campaign's own process tree (the server, the gateway and the simulator, replay and
  the report): ``resource.getrusage(RUSAGE_CHILDREN)`` of this script after the campaign
  exits;
* the trials' sandboxes, from each TrialCompleted's ``cpu_ms`` (the sandbox's cgroup or
  its rusage, as the server recorded it): a sandboxed harness is reaped inside its own PID
  namespace, so RUSAGE_CHILDREN never sees its CPU.

Not counted: the example optimizer's own sandboxes (a standard-library Python making HTTP
calls). The sum over two is the lower bound of the wall time on two cores: the campaign
cannot end sooner on two idle cores, and ends later when it does not keep both busy or
when the machine is shared. The load average is printed before and after.

    python benchmarks/campaign_bench.py [--home DIR]

Nothing is asserted; the target (under 15 minutes on two cores) is read off the output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any


def ledger_figures(home: Path) -> dict[str, Any]:
    """Per run: the grid cell, trials by split, harness CPU seconds; and the totals."""
    from holedger.config import Settings
    from holedger.ledger.store import Ledger

    cfg = Settings.resolve(home)
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    runs = []
    cpu_ms: list[int] = []
    missing_cpu = 0
    try:
        for info in ledger.runs():
            opened = ledger.run_terms(info.run_id)
            d = opened.descriptor
            splits: Counter[str] = Counter()
            run_cpu = 0
            for rec in ledger.records(info.run_id):
                if rec.type != "TrialCompleted":
                    continue
                splits[str(rec.payload["split"])] += 1
                value = rec.payload.get("cpu_ms")
                if value is None:
                    missing_cpu += 1
                else:
                    run_cpu += int(value)
                    cpu_ms.append(int(value))
            cell = info.optimizer if d is None else f"{d.model}/{d.harness}#{d.replicate}"
            runs.append(
                {
                    "run": info.run_id[:8],
                    "task": opened.task_id,
                    "cell": cell,
                    "state": info.state,
                    "dev": splits["dev"],
                    "val": splits["val"],
                    "test": splits["test"],
                    "harness_cpu_s": run_cpu / 1000,
                }
            )
    finally:
        ledger.close()
    return {
        "runs": runs,
        "trials": len(cpu_ms) + missing_cpu,
        "trials_without_cpu": missing_cpu,
        "harness_cpu_s": sum(cpu_ms) / 1000,
        "median_trial_cpu_ms": statistics.median(cpu_ms) if cpu_ms else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, default=None, help="default: a new temporary one")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp) / "home"
        argv = [sys.executable, "-m", "holedger", "--home", str(home)]
        argv += ["campaign", "run", "--example", "--json"]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_after = os.getloadavg()
        if proc.returncode not in (0, 1) or not proc.stdout.strip():
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        summary = json.loads(proc.stdout)
        figures = ledger_figures(home)
    tree_cpu = usage.ru_utime + usage.ru_stime
    total_cpu = tree_cpu + figures["harness_cpu_s"]
    print(f"\n{'run':<9}{'cell':<40}{'state':<8}{'dev':>5}{'val':>5}{'test':>6}{'CPU s':>8}")
    for r in figures["runs"]:
        print(
            f"{r['run']:<9}{r['cell'][:39]:<40}{r['state']:<8}{r['dev']:>5}{r['val']:>5}"
            f"{r['test']:>6}{r['harness_cpu_s']:>8.1f}"
        )
    completed = summary["completed"]
    print(f"\ncampaign: {completed} of {summary['cells']} runs completed, exit {proc.returncode}")
    print(f"trials                         {figures['trials']:>8}")
    if figures["median_trial_cpu_ms"] is not None:
        print(f"median harness CPU per trial   {figures['median_trial_cpu_ms'] / 1000:>8.2f} s")
    print(f"wall time                      {wall:>8.0f} s  ({wall / 60:.1f} min)")
    print(f"CPU, campaign process tree     {tree_cpu:>8.0f} s")
    print(f"CPU, trial sandboxes           {figures['harness_cpu_s']:>8.0f} s")
    print(f"CPU, total                     {total_cpu:>8.0f} s")
    print(
        f"CPU / 2 (two-core lower bound) {total_cpu / 2:>8.0f} s  ({total_cpu / 120:.1f} min; "
        f"target: under 15 min, {total_cpu / 2 / 900:.2f} of it)"
    )
    print(f"wall / (CPU / 2)               {wall / (total_cpu / 2):>8.2f}")
    if figures["trials_without_cpu"]:
        print(f"trials with no CPU recorded    {figures['trials_without_cpu']:>8}")
    print(f"load average after: {load_after[0]:.2f} (5 min {load_after[1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
