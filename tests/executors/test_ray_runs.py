"""Whole runs with trials on a real local Ray cluster (a head and two workers): the demo
on Ray verifies with trials on both nodes, calling the model through the TLS front; a
worker killed mid-evaluation: its trials run once more on the other node under new ids,
and the run still verifies."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server.tinytask import MODEL_MAIN, model_task, write_task_folder

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .ray_cluster import cluster_fixture, ray_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_fixture()


def _trials(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    return [r.payload for r in ledger.records(run_id) if r.type == "TrialCompleted"]


def test_the_demo_on_ray_verifies_with_trials_on_two_nodes(cluster: Any, tmp_path: Path) -> None:
    from holedger.tasks.pinning import pin_task

    task = write_task_folder(tmp_path / "task")
    (task / "seed" / "harness" / "__main__.py").write_text(MODEL_MAIN.replace("WAIT_S", "0"))
    pin_task(task)
    home = tmp_path / "home"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "holedger.cli", "--home", str(home), "demo", "--json"),
            *("--task", str(task), "--executor", f"ray://{cluster.address}"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: g not above the band
    summary = json.loads(proc.stdout)
    assert summary["verified"] is True, proc.stderr[-3000:]
    ledger = Ledger.open(Settings.resolve(home).ledger_url, None, create_tables=False)
    try:
        trials = _trials(ledger, summary["run_id"])
        calls = [r.payload for r in ledger.records(summary["run_id"]) if r.type == "GatewayCall"]
    finally:
        ledger.close()
    nodes = Counter(t["node"] for t in trials)
    assert None not in nodes and len(nodes) == 2, nodes
    # every trial reached the model through the front, and its tokens add up (replay
    # checked it too)
    assert all(t["gateway_calls"] >= 1 for t in trials)
    assert {c["trial_id"] for c in calls if c["scope"] == "target"} == {
        t["trial_id"] for t in trials
    }


def test_a_worker_killed_mid_evaluation_its_trials_run_once_more_elsewhere(
    cluster: Any, tmp_path: Path
) -> None:
    from holedger.server.lifecycle import abort_run

    task = model_task(tmp_path / "task", wait_s=20)
    with ray_service(tmp_path / "home", cluster.address, task) as (service, executor, ledger, link):
        run_id = service.open_run("model", baseline=False).run_id
        done: dict[str, Any] = {}
        evaluation = threading.Thread(
            target=lambda: done.update(ev=service.evaluate(run_id, "seed", "dev", None, 1))
        )
        evaluation.start()
        deadline = time.monotonic() + 180
        # the four running trials have called the model (and now wait): their calls are
        # recorded before the node goes
        while time.monotonic() < deadline:
            link.gateway.flush(5)
            made = {
                r.payload["trial_id"] for r in ledger.records(run_id) if r.type == "GatewayCall"
            }
            if len(made) >= 4:  # each of the first four, two a node, called and now waits
                break
            time.sleep(0.5)
        busy = sorted(n for n, c in executor._inflight.items() if c)
        victim = busy[0]
        node = next(n for n in cluster.worker_nodes if n.node_id == victim)
        cluster.remove_node(node, allow_graceful=False)
        evaluation.join(300)
        assert "ev" in done
        trials = _trials(ledger, run_id)
        calls = [r.payload for r in ledger.records(run_id) if r.type == "GatewayCall"]
        retried = [t for t in trials if t["trial_id"].endswith("-retry")]
        assert retried, "no trial was lost"
        assert all(t["node"] not in (None, victim) for t in retried)
        # the lost attempts' model calls stay recorded under their own trial ids
        lost_ids = {t["trial_id"].removesuffix("-retry") for t in retried}
        assert lost_ids & {c["trial_id"] for c in calls}
        assert not lost_ids & {t["trial_id"] for t in trials}
        # each case once, nothing recorded twice
        assert Counter(t["case_id"] for t in trials) == Counter(c.id for c in task.cases("dev"))
        # the run still verifies (closed here without held-out scoring: its tokens,
        # budget, disclosures and trials are all checked)
        abort_run(service, run_id, "the test ends here")
        report = replay_run(ledger, run_id)
        assert report.verdict == "verified-aborted", report.failed_checks()


def test_a_campaign_on_ray_completes_with_every_trial_on_a_node(
    cluster: Any, tmp_path: Path
) -> None:
    task = write_task_folder(tmp_path / "task")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f"""[campaign]
name = "ray-grid"
tasks = [{str(task)!r}]
replicates = 2
concurrency = 2
[common]
harness = "example-greedy"
args = ["--dev-cases", "2", "--val-cases", "5", "--finalists", "1"]
[[optimizer]]
model = "alpha"
"""
    )
    home = tmp_path / "home"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "holedger.cli", "--home", str(home), "campaign", "run"),
            *(str(grid), "--executor", f"ray://{cluster.address}", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["completed"] == 2
    ledger = Ledger.open(Settings.resolve(home).ledger_url, None, create_tables=False)
    try:
        for run in summary["runs"]:
            trials = _trials(ledger, run["run_id"])
            assert trials and all(t["node"] for t in trials)
            assert replay_run(ledger, run["run_id"]).verdict == "verified"
    finally:
        ledger.close()
