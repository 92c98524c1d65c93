"""The client of the Docker engine the docker backend and its image builder share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from holedger.errors import SandboxError

DEFAULT_SOCKET = "/run/holedger-docker.sock"


def docker_host() -> str | None:
    env = os.environ.get("DOCKER_HOST")
    if env:
        return env
    if Path(DEFAULT_SOCKET).exists():
        return f"unix://{DEFAULT_SOCKET}"
    return None


def docker_client(timeout: int = 60) -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SandboxError("the docker SDK is not installed", hint="pip install docker") from exc
    host = docker_host()
    try:
        if host:
            return docker.DockerClient(base_url=host, timeout=timeout)
        return docker.from_env(timeout=timeout)
    except Exception as exc:
        raise SandboxError(
            f"no Docker engine: {exc}", hint="start one (.ci/docker-up.sh) or set DOCKER_HOST"
        ) from exc


__all__ = ["DEFAULT_SOCKET", "docker_client", "docker_host"]
