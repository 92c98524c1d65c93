"""Trials per second and the latency Ray adds: the local executor against the Ray executor
on the same cores, in one run.

A trivial harness (``python3 main.py`` printing its answer) runs as trial plans through
each executor's ``submit``, the interface the server uses, in the same sandbox backend:

* throughput: rounds of ``--trials`` plans with ``--parallel`` in flight (as many threads,
  each submitting and waiting, as the server's trial threads do), local and Ray by turns
  (a Ray cluster on this machine: a head that takes no trials and one worker node
  offering ``holedger_trial`` = ``--parallel``): local, Ray, local, Ray, ..., local, with
  ``--rounds`` Ray rounds. Each Ray round's ratio is against the mean of the local rounds
  on either side of it, so a change of load during the run counts against both; the
  figure is the median of those ratios. The load average is printed beside each round
  (the machine may be shared);
* latency: ``--sequential`` plans one at a time through each, interleaved; the median
  wall time per trial of each and their difference, the latency Ray adds. Beside it,
  each executor's median overhead per trial: its wall time less the sandbox's own.

Prints the figures beside the targets (Ray's throughput at least 0.8 of local; under 50
ms added per trial). Asserts nothing.

    python benchmarks/executor_bench.py [--trials 60] [--parallel 2] [--rounds 5]
        [--sequential 20] [--backend bwrap]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pygit2

from holedger.sandboxes import Limits, settle
from holedger.server.executor import LocalExecutor, TrialPlan

HARNESS = b'import sys\nprint(\'{"answer": "%s"}\' % sys.stdin.read().strip().upper())\n'
TARGET_RATIO = 0.8
TARGET_ADDED_MS = 50.0


def make_tree(root: Path) -> tuple[Path, str]:
    path = root / "run.git"
    repo = pygit2.init_repository(str(path), bare=True)
    builder = repo.TreeBuilder()
    builder.insert("main.py", repo.create_blob(HARNESS), 0o100644)
    return path, str(builder.write())


def plan(tree: tuple[Path, str], n: int, backend: str) -> TrialPlan:
    return TrialPlan(
        run_id="bench",
        trial_id=f"bench-{n:06d}",
        tree=tree[1],
        repository=tree[0],
        argv=("python3", "main.py"),
        stdin=f"case {n}\n".encode(),
        model="none",
        limits=Limits(wall_s=60),
        backend=backend,
    )


def one(executor: Any, p: TrialPlan, overheads: list[float] | None = None) -> float:
    start = time.perf_counter()
    result = executor.submit(p).result()
    elapsed = time.perf_counter() - start
    if result.exit_status != 0:
        raise SystemExit(f"a trial failed: {result.stderr[-300:]!r}")
    if overheads is not None:
        overheads.append(elapsed - result.wall_ms / 1000)
    return elapsed


def throughput(executor: Any, tree: tuple[Path, str], n: int, parallel: int, b: str) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda i: one(executor, plan(tree, i, b)), range(n)))
    settle()
    return n / (time.perf_counter() - start)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--backend", default="bwrap")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    from holedger.executors.ray_cluster import RayExecutor

    tree = make_tree(Path(tempfile.mkdtemp(prefix="holedger-bench-")))
    local = LocalExecutor()
    store = 80 * 1024 * 1024
    print(f"load average at the start: {load()}", flush=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": store, "include_dashboard": False},
    )
    cluster.add_node(
        num_cpus=args.parallel,
        resources={"holedger_trial": args.parallel},
        object_store_memory=store,
    )
    cluster.wait_for_nodes()
    ray = RayExecutor(f"ray://{cluster.address}")
    rounds: dict[str, list[float]] = {"local": [], "ray": []}
    lat: dict[str, list[float]] = {"local": [], "ray": []}
    over: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for ex in (local, ray):  # warm up: sandbox set-up, Ray's worker processes
            throughput(ex, tree, 2 * args.parallel, args.parallel, args.backend)
        order = [("local", local), ("ray", ray)] * args.rounds + [("local", local)]
        for name, ex in order:
            rate = throughput(ex, tree, args.trials, args.parallel, args.backend)
            rounds[name].append(rate)
            print(f"  {name:5} {rate:6.2f} trials/s   (load average {load()})", flush=True)
        for i in range(args.sequential):
            for name, ex in (("local", local), ("ray", ray)):
                lat[name].append(one(ex, plan(tree, 10_000 + i, args.backend), over[name]))
                settle()
    finally:
        ray.close()
        cluster.shutdown()
    loc = rounds["local"]
    ratios = [r / ((loc[i] + loc[i + 1]) / 2) for i, r in enumerate(rounds["ray"])]
    ratio = statistics.median(ratios)
    med = {k: statistics.median(v) * 1000 for k, v in lat.items()}
    ovh = {k: statistics.median(v) * 1000 for k, v in over.items()}
    added = med["ray"] - med["local"]
    print(
        f"backend {args.backend}, {args.parallel} trials in flight, {args.trials} trials a "
        f"round, {args.rounds} Ray rounds between {args.rounds + 1} local ones"
    )
    print(f"local  median {statistics.median(loc):7.2f} trials/s")
    print(f"ray    median {statistics.median(rounds['ray']):7.2f} trials/s")
    print(
        f"ratio  median {ratio:5.2f} of {', '.join(f'{r:.2f}' for r in ratios)}"
        f"   (target >= {TARGET_RATIO})"
    )
    print(
        f"latency per trial, median of {args.sequential}: local {med['local']:.1f} ms, ray "
        f"{med['ray']:.1f} ms, added {added:.1f} ms (target < {TARGET_ADDED_MS:.0f} ms)"
    )
    print(
        f"overhead per trial beyond the sandbox's own wall time: local {ovh['local']:.1f} ms, "
        f"ray {ovh['ray']:.1f} ms"
    )
    print(f"load average at the end: {load()}")


if __name__ == "__main__":
    main()
