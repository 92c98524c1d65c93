"""Where the time of `holedger demo` goes: figures and ratios side by side.

Runs the demo twice in a fresh temporary home (the first run also pins the seed
baseline; the second reuses it) and splits each run's wall time into phases read from the
ledger's event times: baseline, search (dev and val evaluations), held-out scoring, and
the rest (start, replay, report). Beside them, the cost of one trial's parts: a bare
Python start, importing the openai SDK, and an empty sandbox on the chosen backend.

    python benchmarks/demo_bench.py [--backend bwrap] [--workers 2] [--runs 2]

Nothing is asserted: the target (a first demo under 3 minutes on a 2-core machine with
bwrap) is read off the output. The load average is printed, since other work on the
machine slows every trial.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path


def timed(argv: list[str], repeat: int = 5) -> float:
    """Median seconds of ``argv`` over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def empty_sandbox(backend_name: str | None, repeat: int = 5) -> tuple[str, float]:
    from holedger.sandboxes import get_backend
    from holedger.sandboxes.spec import SandboxSpec

    backend = get_backend(backend_name)
    with tempfile.TemporaryDirectory() as code:
        spec = SandboxSpec(code_dir=Path(code), argv=["python3", "-c", "pass"])
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            backend.run(spec)
            times.append(time.perf_counter() - start)
    return backend.name, statistics.median(times)


def _time(rec_time: str) -> datetime:
    return datetime.strptime(rec_time, "%Y-%m-%dT%H:%M:%S.%fZ")


def phases(home: Path, run_id: str) -> dict[str, float]:
    """Seconds of search and held-out scoring of ``run_id``, and of the baseline run if
    it belongs to this demo; plus the mean trial wall time."""
    from holedger.config import Settings
    from holedger.ledger.store import Ledger

    cfg = Settings.resolve(home)
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        out: dict[str, float] = {}
        walls: list[int] = []
        records = list(ledger.records(run_id))
        opened = _time(records[0].envelope["time"])
        nominated = next(r for r in records if r.type == "CandidateNominated")
        closed = _time(records[-1].envelope["time"])
        out["search_s"] = (_time(nominated.envelope["time"]) - opened).total_seconds()
        out["held_out_s"] = (closed - _time(nominated.envelope["time"])).total_seconds()
        walls = [int(r.payload["wall_ms"]) for r in records if r.type == "TrialCompleted"]
        out["trials"] = len(walls)
        out["trial_wall_ms_mean"] = statistics.mean(walls) if walls else 0.0
        return out
    finally:
        ledger.close()


def baseline_seconds(home: Path) -> float | None:
    from holedger.config import Settings
    from holedger.ledger.store import Ledger

    cfg = Settings.resolve(home)
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        for info in ledger.runs():
            if info.optimizer == "seed-baseline" and info.closed:
                return (_time(info.closed) - _time(info.opened)).total_seconds()
        return None
    finally:
        ledger.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default=None)
    parser.add_argument("--runs", type=int, default=2, help="demo runs (0: the trial parts only)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    py = timed([sys.executable, "-c", "pass"])
    oa = timed([sys.executable, "-c", "import openai"])
    name, sandbox = empty_sandbox(args.backend)
    print(f"python start            {py * 1000:7.0f} ms")
    print(f"python + import openai  {oa * 1000:7.0f} ms   ({oa / py:.1f}x a bare start)")
    print(
        f"empty {name:<6} sandbox    {sandbox * 1000:7.0f} ms   ({sandbox / py:.1f}x a bare start)"
    )
    import json

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        for n in range(args.runs):
            argv = ["holedger", "--home", str(home), "demo", "--json"]
            if args.backend:
                argv += ["--backend", args.backend]
            start = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            total = time.perf_counter() - start
            demo = json.loads(proc.stdout)
            ph = phases(home, demo["run_id"])
            base = baseline_seconds(home) if n == 0 else None
            rest = total - ph["search_s"] - ph["held_out_s"] - (base or 0.0)
            print(
                f"\ndemo run {n + 1}: {total:6.1f} s total, exit {proc.returncode}, g {demo['g']}"
            )
            if base is not None:
                print(f"  seed baseline       {base:6.1f} s  ({base / total:.0%})")
            print(f"  search (dev, val)   {ph['search_s']:6.1f} s  ({ph['search_s'] / total:.0%})")
            print(
                f"  held-out scoring    {ph['held_out_s']:6.1f} s  ({ph['held_out_s'] / total:.0%})"
            )
            print(f"  start/replay/report {rest:6.1f} s  ({rest / total:.0%})")
            print(
                f"  {ph['trials']:.0f} trials, mean wall {ph['trial_wall_ms_mean']:.0f} ms "
                f"({ph['trial_wall_ms_mean'] / 1000 / oa:.1f}x python + import openai)"
            )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
