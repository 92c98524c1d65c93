from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import ServerTask

from .tinytask import make_task


def _home(root: Path) -> Settings:
    settings = Settings.resolve(root / "home")
    Ledger.init_home(settings)
    return settings


def _service(home: Settings, task: ServerTask) -> RunService:
    return RunService(
        home,
        Ledger.from_settings(home),
        ServerConfig(gateway=None, task_loader=lambda ref: task, default_backend="process"),
    )


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, ServerTask]]:
    root = tmp_path_factory.mktemp("server")
    yield _home(root), make_task(root / "task")


@pytest.fixture(scope="session")
def home(shared: tuple[Settings, ServerTask]) -> Settings:
    """One home for the module's runs, so the tiny task's baseline is computed once."""
    return shared[0]


@pytest.fixture(scope="session")
def tiny(shared: tuple[Settings, ServerTask]) -> ServerTask:
    return shared[1]


@pytest.fixture(scope="session")
def service(home: Settings, tiny: ServerTask) -> Iterator[RunService]:
    svc = _service(home, tiny)
    yield svc
    svc.close()
    svc.ledger.close()


@pytest.fixture
def fresh_home(tmp_path: Path) -> Settings:
    return _home(tmp_path)


@pytest.fixture
def fresh_service(fresh_home: Settings, tiny: ServerTask) -> Iterator[RunService]:
    svc = _service(fresh_home, tiny)
    yield svc
    svc.close()
    svc.ledger.close()
