"""A real Ray cluster on this machine for the executor's tests: a head that takes no
trials and two worker nodes offering ``holedger_trial`` (Ray's own multi-node utility,
each node its own raylet and processes). Skips, saying why, where Ray cannot start."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

STORE = 80 * 1024 * 1024  # each node's object store (the smallest Ray takes)


def start_cluster(workers: int = 2, slots: int = 2) -> Any:
    try:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from ray.cluster_utils import Cluster
    except ImportError:
        pytest.skip("Ray is not installed (pip install 'holedger[ray]')")
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "object_store_memory": STORE,
                "include_dashboard": False,
            },
        )
        for _ in range(workers):
            cluster.add_node(
                num_cpus=1, resources={"holedger_trial": slots}, object_store_memory=STORE
            )
        cluster.wait_for_nodes()
    except Exception as exc:  # Ray could not start here
        pytest.skip(f"a local Ray cluster cannot start here: {exc}")
    return cluster


def cluster_fixture() -> Iterator[Any]:
    """A cluster for a module's tests; skips where no isolating sandbox runs trials."""
    from holedger.sandboxes import get_backend

    try:
        get_backend(None)
    except Exception as exc:
        pytest.skip(f"no isolating sandbox here: {exc}")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.shutdown()
