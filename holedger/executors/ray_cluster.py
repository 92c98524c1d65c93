"""The Ray executor (``ray://HEAD:PORT``): each trial a Ray task on a prepared node.

Chosen by ``holedger serve --executor ray://HEAD:PORT`` (or ``HOLEDGER_EXECUTOR``), where
HEAD:PORT is the Ray head's GCS address (``ray start --head --port PORT``); the server
joins the cluster as a driver. Only nodes that offer the custom resource
``holedger_trial`` (``ray start --resources '{"holedger_trial": N}'``, N trials at a time)
take trials: the executor places each trial on one of them itself (the least busy, by its
own count of trials in flight against each node's N), so it always knows where a trial
ran or was lost.

* The candidate tree travels as its git objects, put in Ray's object store once per tree
  and fetched by a node only when its cache lacks that tree id (trees.py checks every
  object against its id on the node).
* The trial's gateway: the server's :class:`~holedger.executors.relay.TrialFront` (TLS,
  a certificate made at start and pinned in each trial's job) lets the trial's relay
  through to the trial's own gateway socket while the trial runs.
* Faults: a task whose worker or node died, whose result was lost, or that gave no
  result within the trial's wall time plus a grace, ends in :class:`TrialLost` naming the
  node; the server then runs the trial once more, on another node, under a new trial id,
  or records it as not run. A cluster that is gone fails :meth:`RayExecutor.check`, so
  the next request is refused before it is recorded.

Ray is imported only here, and this module only when the executor is chosen.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
import urllib.parse
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from holedger.errors import HoledgerError, SandboxError, Unavailable, UsageError
from holedger.executors.faults import TrialLost
from holedger.executors.node import NodeJob, run_job, tree_cache
from holedger.executors.relay import TrialFront
from holedger.executors.trees import pack_tree
from holedger.sandboxes import SandboxResult

RESOURCE = "holedger_trial"
GRACE_S = 60.0  # on top of a trial's wall time, for the transfer and the sandbox's start
NODES_TTL_S = 2.0
TREE_REFS = 64  # trees kept in the object store at once (the newest)
FRONT_HOST_ENV = "HOLEDGER_FRONT_HOST"
FRONT_PORT_ENV = "HOLEDGER_FRONT_PORT"


def parse_url(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ray" or not parts.hostname or parts.port is None:
        raise UsageError(
            f"executor {url!r} is not ray://HOST:PORT",
            hint="give the Ray head's address, e.g. ray://10.0.0.2:6379",
        )
    return parts.hostname, parts.port


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "the Ray executor needs Ray, which is not installed",
            hint="pip install 'holedger[ray]'",
        ) from None
    return ray


def _reachable(host: str, port: int) -> str:
    """This machine's address towards the head; a UsageError when the head is not there."""
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise UsageError(
            f"cannot reach the Ray cluster at {host}:{port}: {exc.strerror or exc}",
            hint="start its head with 'ray start --head --port PORT', or fix the address",
        ) from None


def _ray_trial(job: NodeJob, holder: list[Any]) -> SandboxResult:
    """The Ray task: runs on the node it was placed on."""
    import ray

    node_id = str(ray.get_runtime_context().get_node_id())
    objects = None if tree_cache().has(job.tree) else ray.get(holder[0])
    return run_job(job, objects, node_id)


class RayExecutor:
    """Trials as Ray tasks (see the module's doc)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.host, self.port = parse_url(url)
        local = _reachable(self.host, self.port)
        self.ray = _import_ray()
        try:
            if not self.ray.is_initialized():
                self.ray.init(
                    address=f"{self.host}:{self.port}",
                    logging_level="ERROR",
                    log_to_driver=False,
                    configure_logging=False,
                    namespace="holedger",
                )
        except Exception as exc:
            raise UsageError(
                f"cannot join the Ray cluster at {self.host}:{self.port}: {exc}",
                hint="is it a Ray head's GCS port (ray start --head --port PORT)?",
            ) from None
        self._lock = threading.Lock()
        self._nodes: dict[str, float] = {}
        self._nodes_at = 0.0
        self._inflight: collections.Counter[str] = collections.Counter()
        if not self.nodes():
            self.ray.shutdown()
            raise UsageError(
                f"no node of the Ray cluster at {self.host}:{self.port} offers {RESOURCE}",
                hint=f"start workers with ray start --resources '{{\"{RESOURCE}\": N}}'",
            )
        self._trees: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
        self.front = TrialFront(
            os.environ.get(FRONT_HOST_ENV) or local, int(os.environ.get(FRONT_PORT_ENV) or 0)
        )
        self._remote = self.ray.remote(resources={RESOURCE: 1}, num_cpus=0, max_retries=0)(
            _ray_trial
        )
        self._deadlines: dict[Any, float] = {}
        self._watch_stop = threading.Event()
        threading.Thread(target=self._watch, name="holedger-ray-watch", daemon=True).start()

    # ------------------------------------------------------------------ the interface

    def check(self, backend: str) -> None:
        try:  # first the head's port, at once: Ray's own calls wait for a head that is gone
            socket.create_connection((self.host, self.port), timeout=3).close()
        except OSError:
            raise Unavailable(
                f"the Ray cluster at {self.host}:{self.port} is gone: its head does not answer",
                hint="start it again; 'holedger run recover RUN' records what it left",
            ) from None
        try:
            alive = self.nodes(fresh=True)
        except Exception as exc:
            raise Unavailable(
                f"the Ray cluster at {self.host}:{self.port} is gone: {exc}",
                hint="start it again; 'holedger run recover RUN' records what it left",
            ) from None
        if not alive:
            raise Unavailable(
                f"no node of the Ray cluster at {self.host}:{self.port} offers {RESOURCE} now",
                hint="start or restart its workers",
            )

    def submit(self, plan: Any) -> Future[SandboxResult]:
        future: Future[SandboxResult] = Future()
        avoid = set(getattr(plan, "avoid", ()) or ())
        node = self._pick(avoid)
        if node is None:
            future.set_exception(
                TrialLost(f"no other node of the Ray cluster offers {RESOURCE}", None)
            )
            return future
        gateway = getattr(plan, "gateway", None)
        front = None if gateway is None else self.front.open(plan.trial_id, gateway.socket)
        job = NodeJob(
            trial_id=plan.trial_id,
            tree=plan.tree,
            argv=tuple(plan.argv),
            stdin=plan.stdin,
            model=plan.model,
            limits=plan.limits,
            backend=plan.backend,
            front=front,
            token=None if gateway is None else gateway.token,
        )
        try:
            holder = [self._tree_ref(str(plan.repository), plan.tree)]
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            ref = self._remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(job, holder)
        except Exception as exc:
            self.front.close(plan.trial_id)
            future.set_exception(TrialLost(f"Ray refused the task: {exc}", node))
            return future
        with self._lock:
            self._inflight[node] += 1
            self._deadlines[ref] = time.monotonic() + float(plan.limits.wall_s) + GRACE_S
        ref.future().add_done_callback(lambda f: self._done(f, future, plan.trial_id, node, ref))
        return future

    def describe(self) -> dict[str, str]:
        return {
            "executor": "ray",
            "address": f"{self.host}:{self.port}",
            "nodes": str(len(self._nodes)),
            "front": f"{self.front.host}:{self.front.port}",
        }

    def close(self) -> None:
        self._watch_stop.set()
        self.front.stop()
        self._trees.clear()
        if self.ray.is_initialized():
            self.ray.shutdown()

    # ------------------------------------------------------------------ placement

    def nodes(self, fresh: bool = False) -> dict[str, float]:
        """Live nodes offering the trial resource: node id -> trials at a time."""
        with self._lock:
            if fresh or time.monotonic() - self._nodes_at > NODES_TTL_S:
                self._nodes = {
                    str(n["NodeID"]): float(n["Resources"][RESOURCE])
                    for n in self.ray.nodes()
                    if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) > 0
                }
                self._nodes_at = time.monotonic()
            return dict(self._nodes)

    def _pick(self, avoid: set[str]) -> str | None:
        nodes = {n: c for n, c in self.nodes().items() if n not in avoid}
        if not nodes:
            return None
        with self._lock:
            return min(nodes, key=lambda n: (self._inflight[n] / nodes[n], self._inflight[n], n))

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

    def _done(
        self, done: Future[Any], future: Future[SandboxResult], trial: str, node: str, ref: Any
    ) -> None:
        self.front.close(trial)
        with self._lock:
            self._inflight[node] -= 1
            self._deadlines.pop(ref, None)
        try:
            future.set_result(done.result())
        except Exception as exc:
            future.set_exception(self._fault(exc, node))

    def _fault(self, exc: BaseException, node: str) -> BaseException:
        """What the server sees of a task's failure: the node's own error (a candidate
        object that does not match its id, an unavailable sandbox) as it was raised, and
        anything of Ray's (a dead worker or node, a lost or cancelled task) as TrialLost."""
        exceptions = self.ray.exceptions
        if isinstance(exc, exceptions.RayTaskError):
            cause = exc.as_instanceof_cause()
            if isinstance(cause, HoledgerError):
                return cause
            return SandboxError(f"the trial failed on node {node[:12]}: {exc.cause!r}")
        if isinstance(exc, exceptions.TaskCancelledError):
            why = "gave no result within its wall time and a grace; cancelled"
        else:
            why = f"was lost ({type(exc).__name__})"
        return TrialLost(f"the trial's task on node {node[:12]} {why}", node)

    def _watch(self) -> None:
        while not self._watch_stop.wait(1.0):
            now = time.monotonic()
            with self._lock:
                late = [ref for ref, at in self._deadlines.items() if at < now]
                for ref in late:
                    self._deadlines.pop(ref, None)
            for ref in late:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already ended
                    continue
