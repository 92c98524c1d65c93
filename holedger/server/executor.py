"""Executors: where the sandboxes of trials run, behind one small interface.

The server hands an executor one :class:`TrialPlan` per trial (everything needed to run
that trial's sandbox) and gets the :class:`~holedger.sandboxes.SandboxResult` back through
a future. Everything trusted stays in the server: it opens and closes each trial's gateway
access (the token and socket in the plan), runs the task's verifier on the result, builds
and signs every event, and keeps the budget. An executor only runs sandboxes.

An executor is chosen by a URL: ``--executor`` of ``holedger serve``, else the
``HOLEDGER_EXECUTOR`` environment variable, else ``local``. Its scheme (``local``,
``ray://HEAD:PORT``, ...) names, in :data:`EXECUTORS`, the module and factory that make it;
the module is imported only when chosen, so an executor with heavy dependencies registers
here by name and the server never imports them otherwise.

``local`` (:class:`LocalExecutor`) runs each sandbox in the server process, in the trial
thread that submits it: the server keeps ``workers`` trials of an evaluation in flight,
each in a thread of its own, as it always has.
"""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from holedger.errors import UsageError
from holedger.sandboxes import Backend, Limits, SandboxResult, SandboxSpec, get_backend
from holedger.server.candidates import CandidateRepo, remove_tree

ENV_VAR = "HOLEDGER_EXECUTOR"
DEFAULT_EXECUTOR = "local"


@dataclass(frozen=True)
class GatewayRoute:
    """How one trial's harness reaches the model gateway: the token of this trial alone
    (revoked when the trial ends) and a unix socket of the gateway, on the server's
    machine, that accepts only that token. The sandbox relays a loopback port to it."""

    token: str
    socket: Path


@dataclass(frozen=True)
class TrialPlan:
    """Everything an executor needs to run one trial's sandbox, and nothing more.

    The candidate is named by its git tree id and read from the run's repository (a
    remote executor reads it there on submit and ships it by that id). The case's input
    is the harness's stdin as the server encoded it. ``backend`` is the run's sandbox
    backend (bwrap, docker or process), which every trial of the run uses.
    """

    run_id: str
    trial_id: str
    tree: str
    repository: Path
    argv: tuple[str, ...]
    stdin: bytes
    model: str
    limits: Limits
    backend: str
    gateway: GatewayRoute | None = None
    # Nodes not to run on: where an earlier attempt of this trial was lost (executors
    # that run trials on other machines; the local executor has one place only).
    avoid: tuple[str, ...] = ()


class Executor(Protocol):
    """Runs the sandboxes of trial plans (see the module's doc)."""

    def check(self, backend: str) -> None:
        """Raise a HoledgerError when trials in ``backend`` cannot run now. Called before
        a request is recorded, so a request never is accepted without its trials."""
        ...

    def submit(self, plan: TrialPlan) -> Future[SandboxResult]:
        """Run ``plan``'s sandbox; the future holds its result, or the error that kept it
        from running (the server records such a trial as not run, never loses it)."""
        ...

    def describe(self) -> dict[str, str]:
        """What this executor is, for the server to show and log (name, address, ...)."""
        ...

    def close(self) -> None:
        """Release what the executor holds (pools, connections)."""
        ...


# ------------------------------------------------------------------ what a node runs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sandbox_spec(plan: TrialPlan, code_dir: Path) -> SandboxSpec:
    """The sandbox of ``plan`` with its candidate tree at ``code_dir``: the environment
    holds ``HOLEDGER_MODEL`` and, with a gateway, the SDKs' base URLs (a loopback port the
    sandbox relays to the trial's gateway socket) and the trial's token as their key."""
    env = {"HOLEDGER_MODEL": plan.model}
    relays: dict[int, Path] = {}
    if plan.gateway is not None:
        port = free_port()
        relays[port] = plan.gateway.socket
        env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
        env["OPENAI_API_KEY"] = plan.gateway.token
        # The anthropic SDK appends /v1/messages to its base URL itself.
        env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{port}"
        env["ANTHROPIC_API_KEY"] = plan.gateway.token
    return SandboxSpec(
        code_dir=code_dir,
        argv=list(plan.argv),
        stdin=plan.stdin,
        env=env,
        relays=relays,
        limits=plan.limits,
        label=plan.trial_id,
    )


def run_plan(plan: TrialPlan, backend: Backend, repo: CandidateRepo | None = None) -> SandboxResult:
    """Check the plan's tree out read-only into a private folder and run its sandbox."""
    repo = repo or CandidateRepo(plan.repository)
    with tempfile.TemporaryDirectory(prefix="holedger-trial-") as tmp:
        code = repo.checkout_tree(plan.tree, Path(tmp) / "code")
        try:
            return backend.run(sandbox_spec(plan, code))
        finally:
            remove_tree(code)


# ------------------------------------------------------------------ the local executor


class LocalExecutor:
    """Runs each sandbox in this process, in the thread that submits it (the server's
    trial threads, ``workers`` per evaluation), so its future is done when returned."""

    def __init__(self, url: str = DEFAULT_EXECUTOR) -> None:
        if url not in ("local", "local://"):
            raise UsageError(
                f"executor {url!r}: the local executor takes no address", hint="use 'local'"
            )
        self._repos: dict[Path, CandidateRepo] = {}
        self._lock = threading.Lock()

    def check(self, backend: str) -> None:
        get_backend(backend)

    def submit(self, plan: TrialPlan) -> Future[SandboxResult]:
        future: Future[SandboxResult] = Future()
        try:
            future.set_result(run_plan(plan, get_backend(plan.backend), self._repo(plan)))
        except Exception as exc:  # the server records the trial as not run
            future.set_exception(exc)
        return future

    def describe(self) -> dict[str, str]:
        return {"executor": "local"}

    def close(self) -> None:
        with self._lock:
            self._repos.clear()

    def _repo(self, plan: TrialPlan) -> CandidateRepo:
        with self._lock:
            repo = self._repos.get(plan.repository)
            if repo is None:
                repo = self._repos[plan.repository] = CandidateRepo(plan.repository)
            return repo


# ------------------------------------------------------------------ choosing one

# Scheme -> "module:factory". A factory takes the executor's URL and returns an Executor;
# its module is imported only when the scheme is chosen.
EXECUTORS: dict[str, str] = {
    "local": "holedger.server.executor:LocalExecutor",
    # ray://HEAD:PORT, a Ray cluster's head (holedger[ray]; docs/SCALING.md)
    "ray": "holedger.executors.ray_cluster:RayExecutor",
}


def register_executor(scheme: str, target: str) -> None:
    """Make ``scheme://...`` choose the factory at ``target`` ("module:name")."""
    if not scheme.isidentifier() or ":" not in target:
        raise ValueError(f"bad executor registration {scheme!r} -> {target!r}")
    EXECUTORS[scheme] = target


def executor_scheme(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else url


def make_executor(url: str | None = None) -> Executor:
    """The executor that ``url`` names, else ``HOLEDGER_EXECUTOR``, else the local one; an
    unknown scheme is a UsageError naming the known ones."""
    url = (url or os.environ.get(ENV_VAR) or DEFAULT_EXECUTOR).strip()
    scheme = executor_scheme(url)
    target = EXECUTORS.get(scheme)
    if target is None:
        raise UsageError(
            f"unknown executor {url!r}: known executors are {', '.join(sorted(EXECUTORS))}",
            hint=f"use --executor local (or set {ENV_VAR})",
        )
    module, _, name = target.partition(":")
    factory: Callable[[str], Executor] = getattr(importlib.import_module(module), name)
    return factory(url)
