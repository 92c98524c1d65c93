"""Cross-run analysis of many runs' bundles: seconds and peak memory, with and without
verification.

Writes N synthetic runs (an honest search, nomination, held-out scoring and close, each
with a signed optimizer descriptor spread over 5 models x 2 harnesses x 2 tasks x
replicates) into a fresh SQLite ledger, exports each as a bundle, then times, each in a
fresh process so its peak memory is its own:

* ``grid --no-verify``  read every bundle, compute the grid;
* ``lss --no-verify``   the same, and LSS-lambda;
* ``grid --verify``     replay every bundle (against the baseline bundles given), then
  the grid (on ``--verify-runs`` of them: replay is the slow part).

Prints seconds, runs per second and the peak resident memory of each. Nothing is
asserted: run it, read the figures.

    python benchmarks/analysis_bench.py [--runs 1000] [--verify-runs 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.bundles.export import export_bundle
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor

MODELS = ("m-a", "m-b", "m-c", "m-d", "m-e")
HARNESSES = (("opencode", "common"), ("own", "native"))
TASKS = ("rp-task", "rp-two")


def write_runs(home: Path, n: int) -> list[Path]:
    cfg = Settings.resolve(home)
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    out = home / "bundles"
    out.mkdir()
    paths = []
    seed = "a" * 40
    for i in range(n):
        model = MODELS[i % len(MODELS)]
        harness, scope = HARNESSES[(i // len(MODELS)) % 2]
        task = TASKS[(i // (2 * len(MODELS))) % 2]
        replicate = i // (4 * len(MODELS)) + 1
        t = terms(seed_commit=seed)
        if task != t.task_id:
            t = t.model_copy(update={"task_id": task})
        d = OptimizerDescriptor(
            model=model,
            harness=harness,
            harness_scope=scope,
            replicate=replicate,  # type: ignore[arg-type]
        )
        writer = RunWriter(ledger, t, descriptor=d)
        cand = f"{i:040x}"
        honest_search(writer, seed, cand)
        honest_finish(writer, cand)
        path = out / f"{i:05d}.hlb"
        export_bundle(ledger, writer.run_id, path)
        paths.append(path)
    ledger.close()
    return paths


# Runs the command line in this interpreter and reports its own peak resident memory.
_CHILD = (
    "import resource, runpy, sys\n"
    "sys.argv = ['holedger', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('holedger', run_name='__main__')\n"
    "finally:\n"
    "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "    print(f'PEAK_KB {peak}', file=sys.stderr)\n"
)


def timed(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, exit code) of one analysis process."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, check=False)
    seconds = time.perf_counter() - started
    err = proc.stderr.decode(errors="replace")
    peaks = [int(line.split()[1]) for line in err.splitlines() if line.startswith("PEAK_KB ")]
    if proc.returncode:
        print(err[-500:], file=sys.stderr)
    return seconds, (peaks[-1] / 1024 if peaks else float("nan")), proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--verify-runs", type=int, default=1000)
    parser.add_argument(
        "--tmp",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="Where to write the ledger and bundles (default: memory-backed /dev/shm, so "
        "writing the runs is not bound by the disk's syncs).",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        home = Path(tmp) / "home"
        started = time.perf_counter()
        paths = write_runs(home, args.runs)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"wrote {len(paths)} runs' bundles ({size / 1e6:.1f} MB) in "
            f"{time.perf_counter() - started:.1f} s"
        )
        nowhere = ["--home", str(Path(tmp) / "nowhere"), "analysis"]
        bundles = [a for p in paths for a in ("--bundle", str(p))]
        few = [a for p in paths[: args.verify_runs] for a in ("--bundle", str(p))]
        rows = [
            ("grid --no-verify", [*nowhere, "grid", *bundles, "--no-verify", "--json"], len(paths)),
            ("lss --no-verify", [*nowhere, "lss", *bundles, "--no-verify", "--json"], len(paths)),
            ("grid --verify", [*nowhere, "grid", *few, "--verify", "--json"], args.verify_runs),
        ]
        print(f"{'analysis':22}{'runs':>7}{'seconds':>10}{'runs/s':>10}{'peak MB':>10}{'exit':>6}")
        for label, argv, n in rows:
            seconds, peak, code = timed(argv)
            print(f"{label:22}{n:7d}{seconds:10.1f}{n / seconds:10.1f}{peak:10.0f}{code:6d}")


if __name__ == "__main__":
    main()
