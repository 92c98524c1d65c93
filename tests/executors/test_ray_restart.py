"""One server through Ray clusters that stop and start again on the same address.

The server is not Ray's driver (the executor's driver process is), so it outlives a
cluster: an evaluation on a first cluster; the head and workers stopped and started again
on the same address; the next evaluation of the same run, on the same server, runs on the
new cluster. A cluster that goes away while an evaluation's trials run fails that
evaluation with one line, its request left for the run's next request to record as not
run (that request itself refused while the cluster is gone). The run then closes and
replays VERIFIED, with node ids of every cluster it used.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server.helpers import candidate_with_main
from server.tinytask import MODEL_MAIN, model_task

from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .ray_cluster import ray_service, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.xdist_group("ray")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def clusters() -> Iterator[list[Any]]:
    """The clusters a test starts, each shut down at its end (once)."""
    from holedger.sandboxes import get_backend

    try:
        get_backend(None)
    except Exception as exc:
        pytest.skip(f"no isolating sandbox here: {exc}")
    started: list[Any] = []
    yield started
    for cluster in started:
        if cluster.head_node is not None:
            cluster.shutdown()


def _trial_nodes(ledger: Ledger, run_id: str, after: int = 0) -> set[str | None]:
    records = list(ledger.records(run_id))[after:]
    return {r.payload["node"] for r in records if r.type == "TrialCompleted"}


def _workers(cluster: Any) -> set[str]:
    return {n.node_id for n in cluster.worker_nodes}


def test_one_server_goes_on_through_a_restarted_head_and_fails_one_line_when_it_goes(
    clusters: list[Any], tmp_path: Path
) -> None:
    from holedger.executors.faults import ExecutorGone

    port = _free_port()
    clusters.append(start_cluster(port=port))
    first = clusters[0]
    address = first.address
    assert address.endswith(f":{port}")
    task = model_task(tmp_path / "task")
    with ray_service(tmp_path / "home", address, task) as (service, executor, ledger, _link):
        run_id = service.open_run("model").run_id  # the seed baseline, for nominating
        service.evaluate(run_id, "seed", "dev", None, 1)
        on_first = _trial_nodes(ledger, run_id)
        assert on_first and on_first <= _workers(first), on_first

        # the head and the workers stop, and start again on the same address
        first.shutdown()
        clusters.append(start_cluster(port=port))
        second = clusters[1]
        assert second.address == address
        seen = len(list(ledger.records(run_id)))
        service.evaluate(run_id, "seed", "dev", None, 1)  # the same server, the same run
        on_second = _trial_nodes(ledger, run_id, seen)
        assert on_second and on_second <= _workers(second), on_second
        assert executor.drivers_started >= 2

        # the cluster goes away while an evaluation's trials run (each waits 20 s after
        # its model call): the evaluation fails with one line, nothing of it recorded
        slow = candidate_with_main(service, run_id, task, MODEL_MAIN.replace("WAIT_S", "20"))
        failed: dict[str, BaseException] = {}

        def evaluate() -> None:
            try:
                service.evaluate(run_id, slow, "val", None, 1)
            except BaseException as exc:
                failed["error"] = exc

        seen = len(list(ledger.records(run_id)))
        evaluation = threading.Thread(target=evaluate)
        evaluation.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(executor._inflight.values()):
            time.sleep(0.5)
        time.sleep(5)  # the trials are running on the nodes
        second.remove_node(second.head_node, allow_graceful=False)
        second.head_node = None
        evaluation.join(300)
        assert not evaluation.is_alive()
        error = failed.get("error")
        assert isinstance(error, ExecutorGone), error
        line = error.one_line()
        assert "\n" not in line and f"the Ray cluster at {address} went away" in line
        assert "run recover" in line
        since = list(ledger.records(run_id))[seen:]
        requested = [r.payload for r in since if r.type == "EvaluationRequested"]
        assert len(requested) == 1 and requested[0]["decision"] == "accepted"
        left_id = requested[0]["request_id"]
        kinds = {r.type for r in since}
        assert not kinds & {"TrialCompleted", "DisclosureProjected"}, kinds  # not recorded
        for node in list(second.worker_nodes):
            second.remove_node(node, allow_graceful=False)

        # while the cluster is gone, the run's next request records the left one (its
        # trials as not run), then is refused before it is recorded itself
        from holedger.errors import Unavailable

        with pytest.raises(Unavailable, match="is gone"):
            service.evaluate(run_id, "seed", "dev", None, 1)
        since = list(ledger.records(run_id))[seen:]
        assert len([r for r in since if r.type == "EvaluationRequested"]) == 1
        left = [
            r.payload
            for r in since
            if r.type == "TrialCompleted" and r.payload["request_id"] == left_id
        ]
        assert len(left) == 8 and all(t["node"] is None for t in left)  # the val cases
        assert all(t["exit_status"] is None for t in left)

        # started again: the next evaluation of the run runs on the new cluster
        clusters.append(start_cluster(port=port))
        third = clusters[2]
        seen = len(list(ledger.records(run_id)))
        service.evaluate(run_id, "seed", "dev", None, 1)
        on_third = _trial_nodes(ledger, run_id, seen) - {None}
        assert on_third and on_third <= _workers(third), on_third

        # the run closes (held-out scoring on the third cluster) and verifies
        service.nominate(run_id, "seed")
        report = replay_run(ledger, run_id)
        assert report.verdict == "verified", report.failed_checks()
        every = _trial_nodes(ledger, run_id)
        for cluster_nodes in (on_first, on_second, on_third):
            assert cluster_nodes <= every
