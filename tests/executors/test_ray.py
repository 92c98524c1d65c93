"""The Ray executor on a real local cluster (a head and two worker nodes): trials spread
over the nodes, each in the node's own sandbox; a worker killed mid-trial; bad addresses.

The last tests remove the worker nodes, so they come last in this module.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest

from holedger.errors import Unavailable, UsageError
from holedger.sandboxes import Limits

from .ray_cluster import cluster_fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("ray")]

HARNESS = b"""import sys, time
text = sys.stdin.read().strip()
if text.startswith("sleep"):
    time.sleep(float(text.split()[1]))
print('{"answer": "%s"}' % text.upper())
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_fixture()


@pytest.fixture(scope="module")
def executor(cluster: Any) -> Iterator[Any]:
    from holedger.executors.ray_cluster import RayExecutor

    ex = RayExecutor(f"ray://{cluster.address}")
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("repo") / "run.git"
    repo = pygit2.init_repository(str(path), bare=True)
    builder = repo.TreeBuilder()
    builder.insert("main.py", repo.create_blob(HARNESS), 0o100644)
    return path, str(builder.write())


def _plan(tree: tuple[Path, str], trial_id: str, text: str, **extra: Any) -> Any:
    return types.SimpleNamespace(
        run_id="r",
        trial_id=trial_id,
        tree=tree[1],
        repository=tree[0],
        argv=("python3", "main.py"),
        stdin=text.encode() + b"\n",
        model="m",
        limits=Limits(wall_s=60),
        backend="bwrap",
        gateway=None,
        **extra,
    )


def test_trials_spread_over_the_nodes_each_in_the_nodes_sandbox(
    executor: Any, tree: tuple[Path, str]
) -> None:
    futures = [executor.submit(_plan(tree, f"t-{i}", f"case {i}")) for i in range(6)]
    results = [f.result(timeout=300) for f in futures]
    for i, result in enumerate(results):
        assert result.exit_status == 0, result.stderr[-500:]
        assert result.stdout.strip() == f'{{"answer": "CASE {i}"}}'.encode()
        assert result.isolation == "isolated" and result.backend in ("bwrap", "docker")
    nodes = {r.node for r in results}
    assert len(nodes) == 2 and nodes <= set(executor.nodes())


def test_a_worker_killed_mid_trial_loses_only_its_trials_and_names_the_node(
    cluster: Any, executor: Any, tree: tuple[Path, str]
) -> None:
    from holedger.executors.ray_cluster import TrialLost

    futures = [executor.submit(_plan(tree, f"slow-{i}", "sleep 30")) for i in range(2)]
    time.sleep(8)  # both have started (one per node: the executor spreads them)
    by_id = {n.node_id: n for n in cluster.worker_nodes}
    placed = {n: c for n, c in executor._inflight.items() if c}
    assert sorted(placed.values()) == [1, 1]
    victim = sorted(placed)[0]
    cluster.remove_node(by_id[victim], allow_graceful=False)
    lost = [f for f in futures if f.exception(timeout=120) is not None]
    assert len(lost) == 1
    error = lost[0].exception()
    assert isinstance(error, TrialLost) and error.node == victim
    survivor = next(f for f in futures if f is not lost[0]).result(timeout=120)
    assert survivor.exit_status == 0 and survivor.node != victim
    # the retry the server makes: another node, never the lost one
    again = executor.submit(_plan(tree, "slow-0-retry", "quick", avoid=(victim,)))
    assert again.result(timeout=120).node not in (None, victim)


def test_without_a_node_offering_the_trial_resource_nothing_is_accepted(
    cluster: Any, executor: Any
) -> None:
    from holedger.executors.ray_cluster import RayExecutor

    for node in list(cluster.worker_nodes):
        cluster.remove_node(node, allow_graceful=False)
    deadline = time.monotonic() + 120  # until the head has seen the nodes go
    while executor.nodes(fresh=True) and time.monotonic() < deadline:
        time.sleep(1)
    with pytest.raises(Unavailable, match="no node of the Ray cluster"):
        executor.check("bwrap")
    with pytest.raises(UsageError, match="offers holedger_trial"):
        RayExecutor(f"ray://{cluster.address}")


def test_an_unreachable_ray_address_is_one_line() -> None:
    pytest.importorskip("ray")
    from holedger.executors.ray_cluster import RayExecutor

    with pytest.raises(UsageError) as caught:
        RayExecutor("ray://127.0.0.1:1")
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in caught.value.one_line()
    with pytest.raises(UsageError, match="not ray://HOST:PORT"):
        RayExecutor("ray://no-port")
