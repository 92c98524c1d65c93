"""The Ray driver: a process of its own that the Ray executor starts and owns.

``python -m holedger.executors.ray_driver --fd FD HOST:PORT`` joins the Ray cluster whose
head is HOST:PORT and takes trial jobs from the server over the socket FD, one JSON
message a line (``wire.py``). So the server process is not Ray's driver: when the head
goes away, Ray ends this process, and the server starts another on its next request.

It keeps one :class:`~holedger.executors.node.NodeWorker` (a Ray actor) per node that
offers the trial resource, with as many trials at a time as the node offers, made the
first time the server places a trial there: a trial is one call of a process already
running on the node, not a new task. A candidate tree is put in Ray's object store once
and goes with a node's trials until that node has given a result for a trial of it (it is
then in the node's cache, where the node re-checks every object by its id before use).

Messages from the server: ``nodes`` (the live nodes offering the resource), ``run`` (a
trial placed on a node). To the server: ``ready`` or ``failed`` once, at the start; a
``nodes`` answer; ``done`` once per trial, with the node's own JSON reply (``result`` or
``error``), or ``lost`` (Ray lost the trial: its worker or node died, or no result came
within the trial's wall time and a grace) or ``failed`` (the call failed on the node).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from holedger.executors.node import NodeWorker
from holedger.executors.trees import pack_tree
from holedger.executors.wire import Channel

RESOURCE = "holedger_trial"
TREE_REFS = 64  # trees kept in the object store at once (the newest)


class Driver:
    def __init__(self, ray: Any, channel: Channel) -> None:
        self.ray = ray
        self.channel = channel
        self.self_node = str(ray.get_runtime_context().get_node_id())
        self._lock = threading.Lock()
        self._worker = ray.remote(NodeWorker)
        self._actors: dict[str, Any] = {}
        self._has: dict[str, set[str]] = collections.defaultdict(set)  # node -> trees cached
        self._trees: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
        self._deadlines: dict[str, tuple[float, str]] = {}  # trial -> (deadline, node)
        threading.Thread(target=self._watch, name="holedger-driver-watch", daemon=True).start()

    # ------------------------------------------------------------------ the server's asks

    def serve(self) -> None:
        while (message := self.channel.receive()) is not None:
            if message["op"] == "nodes":
                threading.Thread(target=self._nodes, args=(message,), daemon=True).start()
            elif message["op"] == "run":
                self._run(message)

    def nodes(self) -> tuple[dict[str, float], bool]:
        """(node id -> trials at a time, for the live nodes offering the resource; whether
        the node this driver is attached to is alive in the cluster)."""
        listed = self.ray.nodes()
        alive = {str(n["NodeID"]) for n in listed if n.get("Alive")}
        offering = {
            str(n["NodeID"]): float(n["Resources"][RESOURCE])
            for n in listed
            if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) > 0
        }
        return offering, self.self_node in alive

    def _nodes(self, message: dict[str, Any]) -> None:
        try:
            offering, attached = self.nodes()
            reply: dict[str, Any] = {"nodes": offering, "attached": attached}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        self._send({"op": "nodes", "seq": message.get("seq"), **reply})

    def _run(self, message: dict[str, Any]) -> None:
        trial, node = str(message["trial"]), str(message["node"])
        job = message["job"]
        tree = str(job["tree"])
        try:
            actor = self._actor(node, float(message["slots"]))
            with self._lock:
                cached = tree in self._has[node]
            objects = None if cached else self._tree_ref(str(message["repository"]), tree)
            ref = actor.run.remote(job, objects)
        except Exception as exc:
            why = f"Ray refused the trial: {exc}".splitlines()[0]
            self._send({"op": "done", "trial": trial, "node": node, "lost": why})
            return
        with self._lock:
            self._deadlines[trial] = (time.monotonic() + float(message["deadline_s"]), node)
        ref.future().add_done_callback(lambda f: self._done(f, trial, node, tree, actor))

    # ------------------------------------------------------------------ nodes' workers

    def _actor(self, node: str, slots: float) -> Any:
        with self._lock:
            actor = self._actors.get(node)
            if actor is None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                actor = self._actors[node] = self._worker.options(
                    num_cpus=0,
                    max_concurrency=max(1, math.ceil(slots)),
                    max_restarts=0,
                    max_task_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(node)
                self._has.pop(node, None)
            return actor

    def _tree_ref(self, repository: str, tree: str) -> Any:
        key = (repository, tree)
        with self._lock:
            ref = self._trees.get(key)
            if ref is not None:
                self._trees.move_to_end(key)
                return ref
        ref = self.ray.put(pack_tree(Path(repository), tree))
        with self._lock:
            self._trees[key] = ref
            while len(self._trees) > TREE_REFS:
                self._trees.popitem(last=False)
        return ref

    # ------------------------------------------------------------------ results

    def _done(self, done: Any, trial: str, node: str, tree: str, actor: Any) -> None:
        exceptions = self.ray.exceptions
        try:
            data = done.result()
        except exceptions.RayTaskError as exc:  # the call raised on the node
            why = f"the trial failed on node {node[:12]}: {exc.cause!r}"
            self._end(trial, {"failed": why}, node)
            return
        except Exception as exc:  # the worker or its node died, the result was lost
            with self._lock:
                if self._actors.get(node) is actor:
                    del self._actors[node]
            why = f"the trial's worker on node {node[:12]} was lost ({type(exc).__name__})"
            self._end(trial, {"lost": why}, node)
            return
        try:
            reply = json.loads(data)
        except (TypeError, ValueError):
            self._end(trial, {"failed": f"node {node[:12]} gave a result that is not JSON"}, node)
            return
        if isinstance(reply, dict) and "result" in reply:
            with self._lock:
                if self._actors.get(node) is actor:
                    self._has[node].add(tree)
        self._end(trial, {"reply": reply}, node)

    def _end(self, trial: str, what: dict[str, Any], node: str) -> None:
        with self._lock:
            if self._deadlines.pop(trial, None) is None:
                return  # a result after its deadline: the trial was reported lost
        self._send({"op": "done", "trial": trial, "node": node, **what})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.send(message)
        except OSError:  # the server has gone: serve() ends on its own
            return

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self._lock:
                late = [(t, n) for t, (at, n) in self._deadlines.items() if at < now]
            for trial, node in late:
                why = (
                    f"the trial on node {node[:12]} gave no result within its wall time and a grace"
                )
                self._end(trial, {"lost": why}, node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="holedger-ray-driver")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("address")
    args = parser.parse_args(argv)
    channel = Channel(socket.socket(fileno=args.fd))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray

        ray.init(
            address=args.address,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=False,
            namespace="holedger",
        )
    except Exception as exc:
        channel.send({"op": "failed", "message": str(exc).strip().splitlines()[0][:500]})
        return 1
    driver = Driver(ray, channel)
    offering, _attached = driver.nodes()
    channel.send({"op": "ready", "node": driver.self_node, "nodes": offering})
    try:
        driver.serve()
    finally:
        channel.close()
        os._exit(0)  # Ray's shutdown waits for a head that may be gone; the actors end with us
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
