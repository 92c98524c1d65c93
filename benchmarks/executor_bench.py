"""Trials per second and the latency Ray adds: the local executor against the Ray executor
on the same cores, in one run.

A trivial harness (``python3 main.py`` printing its answer) runs as trial plans through
each executor's ``submit``, the interface the server uses, in the same sandbox backend:

* throughput: ``--trials`` plans with ``--parallel`` in flight (as many threads, each
  submitting and waiting, as the server's trial threads do), through the local executor,
  then through a Ray cluster on this machine (a head that takes no trials and one worker
  node offering ``holedger_trial`` = ``--parallel``), then local again; the local figure
  is the mean of its two rounds, so a change of load during the run counts against both;
* latency: ``--sequential`` plans one at a time through each, interleaved; the median
  wall time per trial of each and their difference, the latency Ray adds (placement, the
  tree's transfer once and a cache hit after, the result's return).

Prints the figures beside the targets (Ray's throughput at least 0.8 of local; under 50
ms added per trial). Asserts nothing.

    python benchmarks/executor_bench.py [--trials 60] [--parallel 2] [--sequential 20]
        [--backend bwrap]
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


def one(executor: Any, p: TrialPlan) -> float:
    start = time.perf_counter()
    result = executor.submit(p).result()
    elapsed = time.perf_counter() - start
    if result.exit_status != 0:
        raise SystemExit(f"a trial failed: {result.stderr[-300:]!r}")
    return elapsed


def throughput(executor: Any, tree: tuple[Path, str], n: int, parallel: int, b: str) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda i: one(executor, plan(tree, i, b)), range(n)))
    settle()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--backend", default="bwrap")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    from holedger.executors.ray_cluster import RayExecutor

    tree = make_tree(Path(tempfile.mkdtemp(prefix="holedger-bench-")))
    local = LocalExecutor()
    store = 80 * 1024 * 1024
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
    try:
        for ex in (local, ray):  # warm up: sandbox set-up, Ray's worker processes
            throughput(ex, tree, 2 * args.parallel, args.parallel, args.backend)
        local_a = throughput(local, tree, args.trials, args.parallel, args.backend)
        ray_tp = throughput(ray, tree, args.trials, args.parallel, args.backend)
        local_b = throughput(local, tree, args.trials, args.parallel, args.backend)
        local_tp = (local_a + local_b) / 2
        lat: dict[str, list[float]] = {"local": [], "ray": []}
        for i in range(args.sequential):
            for name, ex in (("local", local), ("ray", ray)):
                lat[name].append(one(ex, plan(tree, 10_000 + i, args.backend)))
                settle()
    finally:
        ray.close()
        cluster.shutdown()
    med = {k: statistics.median(v) * 1000 for k, v in lat.items()}
    ratio = ray_tp / local_tp
    added = med["ray"] - med["local"]
    print(f"backend {args.backend}, {args.parallel} trials in flight, {args.trials} trials a round")
    print(f"local  {local_tp:7.2f} trials/s (rounds {local_a:.2f}, {local_b:.2f})")
    print(f"ray    {ray_tp:7.2f} trials/s")
    print(f"ratio  {ratio:7.2f}   (target >= {TARGET_RATIO})")
    print(
        f"latency per trial, median of {args.sequential}: local {med['local']:.1f} ms, ray "
        f"{med['ray']:.1f} ms, added {added:.1f} ms (target < {TARGET_ADDED_MS:.0f} ms)"
    )


if __name__ == "__main__":
    main()
