"""What a node does with one trial: the candidate tree from its cache (checked by id), a
relay to the server's trial front, and the trial in the node's own sandbox.

The node chooses its sandbox as ``holedger doctor`` would: bubblewrap, else Docker; a
plan that names ``process`` (no isolation, asked for by name) runs so, and is recorded
and flagged as everywhere else. The result says which backend and isolation ran the
trial and the node's id, for TrialCompleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from holedger.executors.relay import FrontAddress, NodeRelay
from holedger.executors.trees import GitObject, TreeCache
from holedger.sandboxes import Limits, SandboxResult, SandboxSpec, get_backend

CACHE_ENV = "HOLEDGER_NODE_CACHE"
_caches: dict[Path, TreeCache] = {}


@dataclass(frozen=True)
class NodeJob:
    """One trial as it travels to a node (everything in it is plain and picklable)."""

    trial_id: str
    tree: str
    argv: tuple[str, ...]
    stdin: bytes
    model: str
    limits: Limits
    backend: str
    front: FrontAddress | None = None
    token: str | None = None  # the trial's gateway token (dies with the trial)


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
    if objects is not None:
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
