"""A real Ray cluster on this machine for the executor's tests: a head that takes no
trials and two worker nodes offering ``holedger_trial`` (Ray's own multi-node utility,
each node its own raylet and processes). Skips, saying why, where Ray cannot start."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STORE = 80 * 1024 * 1024  # each node's object store (the smallest Ray takes)


def start_cluster(workers: int = 2, slots: int = 2, port: int | None = None) -> Any:
    """A head (its GCS on ``port`` when given) and ``workers`` nodes offering the trial
    resource, ``slots`` each."""
    try:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from ray.cluster_utils import Cluster
    except ImportError:
        pytest.skip("Ray is not installed (pip install 'holedger[ray]')")
    why: Exception | None = None
    for _attempt in range(2):  # a node that took over Ray's 30 s to register: once more
        cluster = Cluster()
        try:
            cluster.add_node(
                num_cpus=1,
                object_store_memory=STORE,
                include_dashboard=False,
                **({} if port is None else {"gcs_server_port": port}),
            )
            for _ in range(workers):
                cluster.add_node(
                    num_cpus=1, resources={"holedger_trial": slots}, object_store_memory=STORE
                )
            cluster.wait_for_nodes()
            return cluster
        except Exception as exc:  # Ray could not start here, or not in time
            why = exc
            cluster.shutdown()
    pytest.skip(f"a local Ray cluster cannot start here: {why}")


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


@contextlib.contextmanager
def ray_service(home_dir: Path, address: str, task: Any) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(a RunService on a new home whose trials go to the Ray cluster at ``address``, its
    executor, its ledger, its gateway link) and ``task`` the only task; closed after."""
    from holedger.config import Settings
    from holedger.executors.ray_cluster import RayExecutor
    from holedger.ledger.store import Ledger
    from holedger.server.gateway_link import GatewayLink
    from holedger.server.service import RunService, ServerConfig

    home = Settings.resolve(home_dir)
    Ledger.init_home(home)
    ledger = Ledger.from_settings(home)
    link = GatewayLink(ledger)
    executor = RayExecutor(f"ray://{address}")
    service = RunService(
        home,
        ledger,
        ServerConfig(gateway=link, task_loader=lambda r: task, workers=4, executor=executor),
    )
    try:
        yield service, executor, ledger, link
    finally:
        service.close()
        executor.close()
        link.close()
        ledger.close()
