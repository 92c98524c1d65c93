"""The Ray executor (``ray://HEAD:PORT``): trials on prepared nodes of a Ray cluster.

Chosen by ``holedger serve --executor ray://HEAD:PORT`` (or ``HOLEDGER_EXECUTOR``), where
HEAD:PORT is the Ray head's GCS address (``ray start --head --port PORT``). The server
process is not Ray's driver: the executor starts a driver process of its own
(``ray_driver.py``) and talks to it over a socket pair in plain JSON (``wire.py``,
through ``driver_link.py``), so the server never imports Ray nor unpickles what nodes
send. When the driver ends (Ray ends a driver whose head has gone) or finds that its node
is no longer in the cluster (the head restarted), the executor starts a new driver on its
next check or submission, and the same server goes on with the new cluster.

Only nodes that offer the custom resource ``holedger_trial`` (``ray start --resources
'{"holedger_trial": N}'``, N trials at a time) take trials: the executor places each
trial on one of them itself (the least busy, by its own count of trials in flight against
each node's N), so it always knows where a trial ran or was lost.

* The candidate tree travels as its git objects, by its tree id: the driver sends them
  with a node's trials of that tree until the node has run one (then its cache has it;
  trees.py checks every object against its id on the node, when stored and when used).
* The trial's gateway: the server's :class:`~holedger.executors.relay.TrialFront` (TLS,
  a certificate made at start and pinned in each trial's job) lets the trial's relay
  through to the trial's own gateway socket while the trial runs.
* Faults: a trial whose worker or node died, whose result was lost, or that gave no
  result within the trial's wall time plus a grace, ends in :class:`TrialLost` naming the
  node; the server then runs the trial once more, on another node, under a new trial id,
  or records it as not run. A cluster that goes away while trials run (the driver ends,
  or the head stops answering) fails them with :class:`ExecutorGone`, which fails the
  evaluation; a cluster that is gone fails :meth:`RayExecutor.check`, so the next request
  is refused before it is recorded.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import socket
import threading
import time
import urllib.parse
from concurrent.futures import Future
from typing import Any

from holedger.errors import SandboxError, Unavailable, UsageError
from holedger.executors.driver_link import DriverFailed, DriverLink
from holedger.executors.faults import ExecutorGone, TrialLost
from holedger.executors.node import NodeJob, job_to_json
from holedger.executors.relay import TrialFront
from holedger.executors.wire import WireError, result_from_json
from holedger.sandboxes import SandboxResult

RESOURCE = "holedger_trial"
GRACE_S = 60.0  # on top of a trial's wall time, for the transfer and the sandbox's start
NODES_TTL_S = 2.0
ASK_TIMEOUT_S = 30.0  # for the driver's list of nodes
WATCH_S = 2.0
HEAD_MISSES = 3  # the head's port unanswered this many watches in a row ends the driver
FRONT_HOST_ENV = "HOLEDGER_FRONT_HOST"
FRONT_PORT_ENV = "HOLEDGER_FRONT_PORT"


def parse_url(url: str) -> tuple[str, int]:
    try:  # a port that is not a number or past 65535, an unclosed [IPv6 address
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
    if port is None or parts.scheme != "ray" or not parts.hostname:
        raise UsageError(
            f"executor {url!r} is not ray://HOST:PORT",
            hint="give the Ray head's address, e.g. ray://10.0.0.2:6379",
        )
    return parts.hostname, port


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise UsageError(
            "the Ray executor needs Ray, which is not installed",
            hint="pip install 'holedger[ray]'",
        )


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


class RayExecutor:
    """Trials on a Ray cluster, through a driver process (see the module's doc)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.host, self.port = parse_url(url)
        self.address = f"{self.host}:{self.port}"
        local = _reachable(self.host, self.port)
        _require_ray()
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._driver: DriverLink | None = None
        self.drivers_started = 0
        self._nodes: dict[str, float] = {}
        self._nodes_at = 0.0
        self._inflight: collections.Counter[str] = collections.Counter()
        self._pending: dict[str, tuple[Future[SandboxResult], str, DriverLink]] = {}
        try:
            link = self._start()
        except DriverFailed as exc:
            raise UsageError(
                f"cannot join the Ray cluster at {self.address}: {exc}",
                hint="is it a Ray head's GCS port (ray start --head --port PORT)?",
            ) from None
        if not self._nodes:
            link.close()
            raise UsageError(
                f"no node of the Ray cluster at {self.address} offers {RESOURCE}",
                hint=f"start workers with ray start --resources '{{\"{RESOURCE}\": N}}'",
            )
        self.front = TrialFront(
            os.environ.get(FRONT_HOST_ENV) or local, int(os.environ.get(FRONT_PORT_ENV) or 0)
        )
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="holedger-ray-watch", daemon=True).start()

    # ------------------------------------------------------------------ the interface

    def check(self, backend: str) -> None:
        try:  # first the head's port, at once: Ray's own calls wait for a head that is gone
            socket.create_connection((self.host, self.port), timeout=3).close()
        except OSError:
            raise self._gone_error("its head does not answer") from None
        why: DriverFailed | None = None
        for _attempt in range(2):  # a driver of a cluster that changed is replaced once
            try:
                alive = self.nodes(fresh=True)
                break
            except DriverFailed as exc:
                why = exc
                self._drop_driver()
        else:
            raise self._gone_error(str(why)) from None
        if not alive:
            raise Unavailable(
                f"no node of the Ray cluster at {self.address} offers {RESOURCE} now",
                hint="start or restart its workers",
            )

    def submit(self, plan: Any) -> Future[SandboxResult]:
        future: Future[SandboxResult] = Future()
        try:
            link = self._link()
            nodes = self.nodes()
        except DriverFailed as exc:
            future.set_exception(self._gone(str(exc)))
            return future
        node = self._pick(nodes, set(getattr(plan, "avoid", ()) or ()))
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
        with self._lock:
            self._pending[plan.trial_id] = (future, node, link)
            self._inflight[node] += 1
        try:
            if link.gone.is_set():
                raise OSError("the driver has gone")
            link.run(
                {
                    "trial": plan.trial_id,
                    "node": node,
                    "slots": nodes[node],
                    "job": job_to_json(job),
                    "repository": str(plan.repository),
                    "deadline_s": float(plan.limits.wall_s) + GRACE_S,
                }
            )
        except OSError:
            self._finish(plan.trial_id, self._gone(link.last_words() or "its driver ended"))
        return future

    def describe(self) -> dict[str, str]:
        return {
            "executor": "ray",
            "address": self.address,
            "nodes": str(len(self._nodes)),
            "front": f"{self.front.host}:{self.front.port}",
        }

    def close(self) -> None:
        self._stop.set()
        self.front.stop()
        with self._start_lock:
            link, self._driver = self._driver, None
        if link is not None:
            link.close()

    # ------------------------------------------------------------------ the driver

    def _start(self) -> DriverLink:
        try:  # Ray's driver would wait a minute for a head that is gone
            socket.create_connection((self.host, self.port), timeout=3).close()
        except OSError:
            raise DriverFailed("its head does not answer") from None
        link = DriverLink(self.address, self._on_done, self._on_gone)
        with self._lock:
            self._driver = link
            self._nodes = link.first_nodes
            self._nodes_at = time.monotonic()
        self.drivers_started += 1
        return link

    def _link(self) -> DriverLink:
        """The running driver, or a new one when it has gone (the head restarted, Ray
        ended it): a DriverFailed when none can join the cluster now."""
        with self._start_lock:
            link = self._driver
            if link is not None and link.alive():
                return link
            return self._start()

    def _drop_driver(self) -> None:
        with self._start_lock:
            link, self._driver = self._driver, None
        if link is not None:
            link.kill()

    def nodes(self, fresh: bool = False) -> dict[str, float]:
        """Live nodes offering the trial resource: node id -> trials at a time."""
        with self._lock:
            if not fresh and time.monotonic() - self._nodes_at <= NODES_TTL_S:
                return dict(self._nodes)
        link = self._link()
        offering, attached = link.nodes(ASK_TIMEOUT_S)
        if not attached:  # the head restarted: this driver's node is not in the cluster
            raise DriverFailed("the Ray driver's node is no longer in the cluster")
        with self._lock:
            self._nodes = offering
            self._nodes_at = time.monotonic()
            return dict(offering)

    def _pick(self, nodes: dict[str, float], avoid: set[str]) -> str | None:
        nodes = {n: c for n, c in nodes.items() if n not in avoid}
        if not nodes:
            return None
        with self._lock:
            return min(nodes, key=lambda n: (self._inflight[n] / nodes[n], self._inflight[n], n))

    # ------------------------------------------------------------------ results

    def _on_done(self, message: dict[str, Any]) -> None:
        trial = message.get("trial")
        with self._lock:
            entry = self._pending.get(trial) if isinstance(trial, str) else None
        if entry is None or not isinstance(trial, str):
            return
        self._finish(trial, _outcome(message, entry[1]))

    def _on_gone(self, link: DriverLink) -> None:
        with self._lock:
            dead = [t for t, entry in self._pending.items() if entry[2] is link]
            if self._driver is link:
                self._driver = None
        why = link.last_words() or "its driver ended"
        for trial in dead:
            self._finish(trial, self._gone(why))

    def _finish(self, trial: str, outcome: SandboxResult | BaseException) -> None:
        with self._lock:
            entry = self._pending.pop(trial, None)
            if entry is None:
                return
            self._inflight[entry[1]] -= 1
        self.front.close(trial)
        if isinstance(outcome, BaseException):
            entry[0].set_exception(outcome)
        else:
            entry[0].set_result(outcome)

    def _gone(self, why: str) -> ExecutorGone:
        return ExecutorGone(
            f"the Ray cluster at {self.address} went away while trials ran: {why}",
            hint="start it again; the run's next request, or 'holedger run recover RUN', "
            "records what it left",
        )

    def _gone_error(self, why: str) -> Unavailable:
        return Unavailable(
            f"the Ray cluster at {self.address} is gone: {why}",
            hint="start it again; 'holedger run recover RUN' records what it left",
        )

    def _watch(self) -> None:
        """While trials run, the head's port: a head that stops answering for a while
        ends the driver, so its trials fail now rather than when Ray gives up."""
        missed = 0
        while not self._stop.wait(WATCH_S):
            with self._lock:
                busy = bool(self._pending)
                link = self._driver
            if not busy or link is None:
                missed = 0
                continue
            try:
                socket.create_connection((self.host, self.port), timeout=2).close()
                missed = 0
            except OSError:
                missed += 1
                if missed >= HEAD_MISSES:
                    link.kill()
                    missed = 0


def _outcome(message: dict[str, Any], node: str) -> SandboxResult | BaseException:
    """What the driver's ``done`` says of a trial placed on ``node``, decoded field by
    field: the node's result, its own error, or the trial lost."""
    if isinstance(message.get("lost"), str):
        return TrialLost(str(message["lost"]), node)
    if isinstance(message.get("failed"), str):
        return SandboxError(str(message["failed"]))
    reply = message.get("reply")
    try:
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            return SandboxError(f"on node {node[:12]}: {reply['error']}")
        if not isinstance(reply, dict) or "result" not in reply:
            raise WireError("the reply holds neither a result nor an error")
        result = result_from_json(reply["result"])
        if result.node != node:
            raise WireError(f"the result names node {str(result.node)[:12]}")
        return result
    except WireError as exc:
        return SandboxError(f"node {node[:12]} gave a malformed result: {exc}")
