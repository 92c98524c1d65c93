"""What a node does with one trial: the candidate tree from its cache (checked by id), a
relay to the server's trial front, and the trial in the node's own sandbox.

A node runs trials in a :class:`NodeWorker`, one long-lived process per node and server
(a Ray actor, made by the driver, ``ray_driver.py``): it takes each trial's job as plain
JSON and gives back its result as JSON (``wire.py``), so nothing the node sends is
unpickled by the server.

The node chooses its sandbox as ``holedger doctor`` would: bubblewrap, else Docker; a
plan that names ``process`` (no isolation, asked for by name) runs so, and is recorded
and flagged as everywhere else. The result says which backend and isolation ran the
trial and the node's id, for TrialCompleted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from holedger.errors import HoledgerError
from holedger.executors.relay import FrontAddress, NodeRelay
from holedger.executors.trees import GitObject, TreeCache
from holedger.executors.wire import WireError, b64, field, result_to_json, unb64
from holedger.sandboxes import Limits, SandboxResult, SandboxSpec, get_backend

CACHE_ENV = "HOLEDGER_NODE_CACHE"
_caches: dict[Path, TreeCache] = {}


@dataclass(frozen=True)
class NodeJob:
    """One trial as it travels to a node (as JSON: :func:`job_to_json`)."""

    trial_id: str
    tree: str
    argv: tuple[str, ...]
    stdin: bytes
    model: str
    limits: Limits
    backend: str
    front: FrontAddress | None = None
    token: str | None = None  # the trial's gateway token (dies with the trial)


def job_to_json(job: NodeJob) -> dict[str, Any]:
    front = job.front
    return {
        "trial_id": job.trial_id,
        "tree": job.tree,
        "argv": list(job.argv),
        "stdin": b64(job.stdin),
        "model": job.model,
        "limits": asdict(job.limits),
        "backend": job.backend,
        "front": None
        if front is None
        else {**asdict(front), "cert_pem": front.cert_pem.decode("ascii")},
        "token": job.token,
    }


def job_from_json(obj: Any) -> NodeJob:
    argv = field(obj, "argv", list)
    if not all(isinstance(a, str) for a in argv):
        raise WireError("'argv' is not a list of strings")
    limits = field(obj, "limits", dict)
    if set(limits) != set(asdict(Limits())) or not all(
        isinstance(v, (int, float, type(None))) and not isinstance(v, bool) for v in limits.values()
    ):
        raise WireError("'limits' does not name the sandbox's limits")
    front = field(obj, "front", dict, type(None))
    return NodeJob(
        trial_id=field(obj, "trial_id", str),
        tree=field(obj, "tree", str),
        argv=tuple(argv),
        stdin=unb64(field(obj, "stdin", str), "stdin"),
        model=field(obj, "model", str),
        limits=Limits(**limits),
        backend=field(obj, "backend", str),
        front=None
        if front is None
        else FrontAddress(
            host=field(front, "host", str),
            port=field(front, "port", int),
            cert_pem=field(front, "cert_pem", str).encode("ascii"),
            fingerprint=field(front, "fingerprint", str),
            trial_id=field(front, "trial_id", str),
            secret=field(front, "secret", str),
        ),
        token=field(obj, "token", str, type(None)),
    )


class NodeWorker:
    """A node's long-lived trial runner (a Ray actor on the node ``node_id``)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        tree_cache()

    def ready(self) -> str:
        return self.node_id

    def run(self, job: dict[str, Any], objects: list[GitObject] | None) -> bytes:
        """Run one trial; its result, or the node's own error, as a JSON object."""
        try:
            result = run_job(job_from_json(job), objects, self.node_id)
        except HoledgerError as exc:
            return json.dumps({"error": exc.one_line()}).encode()
        return json.dumps({"result": result_to_json(result)}).encode()


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "holedger-node-cache")


def tree_cache() -> TreeCache:
    root = cache_root()
    if root not in _caches:
        _caches[root] = TreeCache(root)
    return _caches[root]


def node_backend(requested: str) -> str:
    """``process`` when the plan asks for it by name, else the strongest here."""
    return "process" if requested == "process" else get_backend(None).name


def run_job(job: NodeJob, objects: list[GitObject] | None, node_id: str) -> SandboxResult:
    """Run ``job`` here; ``objects`` are its tree's objects when the caller sent them."""
    cache = tree_cache()
    if objects is not None and not cache.has(job.tree):
        cache.store(objects)
    backend = get_backend(node_backend(job.backend))
    work = Path(tempfile.mkdtemp(prefix="holedger-node-"))
    work.chmod(0o711)
    relay: NodeRelay | None = None
    try:
        code = cache.checkout(job.tree, work / "code")
        env = {"HOLEDGER_MODEL": job.model}
        relays: dict[int, Path] = {}
        if job.front is not None:
            sock_dir = work / "gw"
            sock_dir.mkdir()
            sock_dir.chmod(0o755)
            relay = NodeRelay(sock_dir / "gw.sock", job.front)
            port = _free_port()
            relays[port] = relay.path
            env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
            env["OPENAI_API_KEY"] = env["ANTHROPIC_API_KEY"] = job.token or ""
            env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{port}"
        spec = SandboxSpec(
            code_dir=code,
            argv=list(job.argv),
            stdin=job.stdin,
            env=env,
            relays=relays,
            limits=job.limits,
            label=job.trial_id,
        )
        result = backend.run(spec)
    finally:
        if relay is not None:
            relay.close()
        _remove(work)
    return replace(result, node=node_id)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _remove(path: Path) -> None:
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path, ignore_errors=True)
