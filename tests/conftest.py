"""How the suite is spread over worker processes (pytest-xdist; ``-n`` and ``--dist`` are
in pyproject's addopts, so ``python -m pytest`` runs it this way; ``-n 0`` runs it in one
process).

Tests are handed out a whole file at a time, so a module's fixtures are made once and a
file's tests run in their written order. A session fixture is made once per worker that
uses it: the costly ones are named in ``MADE_ONCE``, and every file using one of them
goes to one worker with the others (the demo tour's files share one demo run and its
folder). Files marked ``xdist_group("NAME")`` go to one worker together too. The longest
units are handed out first (``LONGEST_FIRST``), so no worker is left with a long one at
the end while the others wait.

Every worker collects the suite itself and all must collect the same test ids: give
``parametrize`` values that differ per process (random, time, uuid) stable ``ids``.
"""

from __future__ import annotations

import importlib.util
import os
from collections import OrderedDict
from typing import Any

import pytest

# Work units that take longest on a 2-core machine, longest first: a file's path, or
# "@" and the name of an xdist_group. Units not named here follow in collection order.
LONGEST_FIRST = (
    "@tour",
    "tests/audit/test_demo_audit.py",
    "tests/demo/test_demo_interrupt.py",
    "tests/ledger/test_tamper_matrix.py",
    "tests/replay/test_chunks.py",
    "@audited",
    "tests/ledger/test_storage_errors_cli.py",
    "tests/bundles/test_bundle_fuzz.py",
    "tests/gateway/test_close_race.py",
    "tests/proofs/test_proofs_exhaustive.py",
    "tests/tasks/test_demo_task.py",
    "tests/ledger/test_crash_safety.py",
    "tests/gateway/test_formats_budget.py",
)

# Session fixtures that take long to make (a whole demo, an audited run): the files that
# use one form the xdist_group of its name, so it is made once, on one worker.
MADE_ONCE = ("tour", "audited")


SIZE = ("COLUMNS", "LINES")


def pytest_configure(config: pytest.Config) -> None:
    given = getattr(config, "workerinput", {}).get("terminal_size_env")
    for name, value in (given or {}).items():  # on a worker: as pytest was started
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.hookimpl(tryfirst=True)  # before xdist adds the groups to the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    group: dict[object, str] = {}
    for item in items:
        for name in MADE_ONCE:
            if name in getattr(item, "fixturenames", ()):
                group.setdefault(item.path, name)
    for item in items:
        if item.path in group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group[item.path]))


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its xdist_group (xdist appends "@NAME" to the node id of
    a grouped test), else its file."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # a parameter may contain "@" too
        return "@" + nodeid.rsplit("@", 1)[1]
    return nodeid.split("::", 1)[0]


def longest_first(units: list[str]) -> list[str]:
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    return sorted(units, key=lambda unit: rank.get(unit, len(rank)))  # stable: the rest in order


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Units as ``unit_of`` gives them, handed out longest first."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:
                self.ordered = True
                queue = self.workqueue
                self.workqueue = OrderedDict((u, queue[u]) for u in longest_first(list(queue)))
            super()._assign_work_unit(node)

    def pytest_configure_node(node: Any) -> None:
        """Workers start with COLUMNS and LINES set in their environment (80 and 24) even
        where pytest itself was started without them, and holedger wraps its output to
        COLUMNS: hand the workers the values (or their absence) that pytest was given."""
        node.workerinput["terminal_size_env"] = {name: os.environ.get(name) for name in SIZE}

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":  # another --dist asked for: that one
            return None
        return FileScheduling(config, log)
