"""A campaign's grid file (GRID.toml): tasks × optimizer configurations × harnesses ×
replicates, and how to run them.

```toml
[campaign]
name = "offline-grid"        # the runs' optimizer label is "campaign:NAME"
tasks = ["officeqa-lite"]    # task names or folders
replicates = 2
concurrency = 2              # runs at a time
workers = 2                  # trials at a time, over all runs (the server's pool)
executor = "local"           # or "ray://HEAD:PORT"
backend = "bwrap"            # optional: the sandbox backend (default: the strongest)
test_cases = 16              # optional: run each task as a copy whose test split keeps 16
                             # of its test cases (demo/campaign_tasks.py)

[common]                     # optional: the harness every optimizer also runs in
harness = "example-greedy"
args = ["--strategy", "greedy"]

[[optimizer]]                # one optimizer configuration (a stand-in for a model)
model = "order-given"
family = "example"           # optional
release = "1"                # optional
args = ["--order", "given"]
native = { harness = "given-singles", args = ["--strategy", "singles"] }   # optional
```

Each cell is one run: (task, model, harness, scope, replicate). The cell's identity is
what RunOpened signs (task, the optimizer descriptor and the campaign's label), so a
resumed campaign finds its runs in the ledger, never by a file name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from holedger.errors import UsageError

if TYPE_CHECKING:
    from holedger.schemas.events import OptimizerDescriptor

EXAMPLE_GRID = Path(__file__).resolve().parent / "grids" / "offline.toml"
LABEL_PREFIX = "campaign:"
_ARGS_ALLOWED = (
    "--strategy",
    "--order",
    "--max-edits",
    "--dev-cases",
    "--val-cases",
    "--finalists",
    "--shortcuts",
)


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    task: str
    model: str
    harness: str
    scope: Literal["native", "common"]
    replicate: int
    args: tuple[str, ...]
    family: str | None = None
    release: str | None = None

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.task, self.model, self.harness, self.scope, self.replicate)

    @property
    def name(self) -> str:
        return f"{self.task}/{self.model}/{self.harness}#{self.replicate}"


@dataclass
class Grid:
    name: str
    tasks: list[str]
    replicates: int
    concurrency: int
    workers: int
    executor: str
    backend: str | None
    cells: list[Cell] = field(default_factory=list)
    test_cases: int | None = None  # held-out scoring on a copy of each task with N test cases
    source: Path | None = None

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.name


def load_grid(path: Path) -> Grid:
    """The grid in ``path``; a UsageError (one line, naming the file) for anything wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise UsageError(f"no grid file {path}", hint="give a GRID.toml, or --example") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not TOML: {exc}", hint="see docs/SCALING.md") from None
    grid = parse_grid(data, str(path))
    grid.source = path
    return grid


def parse_grid(data: dict[str, Any], where: str = "grid") -> Grid:
    def bad(message: str) -> UsageError:
        return UsageError(f"{where}: {message}", hint="see docs/SCALING.md for the grid format")

    unknown = set(data) - {"campaign", "common", "optimizer"}
    if unknown:
        raise bad(f"unknown table {sorted(unknown)[0]!r}")
    camp = data.get("campaign")
    if not isinstance(camp, dict):
        raise bad("no [campaign] table")
    known = {"name", "tasks", "replicates", "concurrency", "workers", "executor", "backend"}
    known.add("test_cases")
    extra = set(camp) - known
    if extra:
        raise bad(f"unknown key campaign.{sorted(extra)[0]}")
    name = camp.get("name")
    if not isinstance(name, str) or not name or not name.replace("-", "").isalnum():
        raise bad("campaign.name must be letters, digits and dashes")
    tasks = camp.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise bad("campaign.tasks must be a list of task names or folders")
    if len(set(tasks)) != len(tasks):
        raise bad(f"task {_first_duplicate(tasks)!r} is listed twice (a duplicate cell)")
    replicates = _positive(camp.get("replicates", 1), "campaign.replicates", bad)
    concurrency = _positive(camp.get("concurrency", 1), "campaign.concurrency", bad)
    workers = _positive(camp.get("workers", 2), "campaign.workers", bad)
    executor = camp.get("executor", "local")
    if not isinstance(executor, str) or not (executor == "local" or executor.startswith("ray://")):
        raise bad("campaign.executor must be 'local' or 'ray://HOST:PORT'")
    backend = camp.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise bad("campaign.backend must be a sandbox backend's name")
    common = data.get("common")
    if common is not None:
        common = _harness(common, "common", bad)
    optimizers = data.get("optimizer")
    if not isinstance(optimizers, list) or not optimizers:
        raise bad("no [[optimizer]] configuration")
    grid = Grid(name, list(tasks), replicates, concurrency, workers, executor, backend)
    if "test_cases" in camp:
        grid.test_cases = _positive(camp["test_cases"], "campaign.test_cases", bad)
    seen: set[tuple[str, str, str, str, int]] = set()
    for number, opt in enumerate(optimizers, 1):
        if not isinstance(opt, dict):
            raise bad(f"optimizer {number} is not a table")
        extra = set(opt) - {"model", "family", "release", "args", "native"}
        if extra:
            raise bad(f"unknown key {sorted(extra)[0]!r} in optimizer {number}")
        model = opt.get("model")
        if not isinstance(model, str) or not model:
            raise bad(f"optimizer {number} has no model name")
        args = _args(opt.get("args", []), f"optimizer {model!r}", bad)
        harnesses: list[tuple[str, Literal["native", "common"], tuple[str, ...]]] = []
        if common is not None:
            harnesses.append((common[0], "common", common[1]))
        if opt.get("native") is not None:
            native = _harness(opt["native"], f"optimizer {model!r} native", bad)
            harnesses.append((native[0], "native", native[1]))
        if not harnesses:
            raise bad(f"optimizer {model!r} has no harness: give [common] or its native one")
        for task in tasks:
            for harness, scope, harness_args in harnesses:
                for replicate in range(1, replicates + 1):
                    cell = Cell(
                        task,
                        model,
                        harness,
                        scope,
                        replicate,
                        (*harness_args, *args),
                        _text(opt.get("family"), "family", bad),
                        _text(opt.get("release"), "release", bad),
                    )
                    _signable(cell, bad)
                    if cell.key in seen:
                        raise bad(f"duplicate cell {cell.name} ({scope})")
                    seen.add(cell.key)
                    grid.cells.append(cell)
    return grid


def _signable(cell: Cell, bad: Any) -> None:
    """The cell's optimizer descriptor is one RunOpened can sign (a release an ordinal or
    a date; names without control characters, at most 200 characters), so a campaign is
    not refused at its first run of the cell, after others ran."""
    from pydantic import ValidationError

    try:
        descriptor_of(cell)
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])
        raise bad(
            f"optimizer {cell.model!r}: {field} {getattr(cell, field, None)!r} cannot be "
            f"signed as a descriptor's {field} (a release is an ordinal such as 3 or a date "
            "such as 2026-05-01; names have no control characters, at most 200 characters)"
        ) from None


def _positive(value: Any, name: str, bad: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad(f"{name} must be a whole number of at least 1")
    return value


def _text(value: Any, name: str, bad: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise bad(f"{name} must be text")
    return value


def _args(value: Any, where: str, bad: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise bad(f"{where}: args must be a list of strings")
    for arg in value:
        if arg.startswith("-") and arg not in _ARGS_ALLOWED:
            raise bad(f"{where}: unknown optimizer option {arg!r}")
    return tuple(value)


def _harness(value: Any, where: str, bad: Any) -> tuple[str, tuple[str, ...]]:
    if not isinstance(value, dict) or not isinstance(value.get("harness"), str):
        raise bad(f"{where}: give harness = NAME (and args)")
    extra = set(value) - {"harness", "args"}
    if extra:
        raise bad(f"{where}: unknown key {sorted(extra)[0]!r}")
    return value["harness"], _args(value.get("args", []), where, bad)


def _first_duplicate(items: list[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return ""


def descriptor_of(cell: Cell) -> OptimizerDescriptor:
    """The optimizer descriptor a cell's runs sign in RunOpened."""
    from holedger.schemas.events import OptimizerDescriptor

    return OptimizerDescriptor(
        model=cell.model,
        family=cell.family,
        release=cell.release,
        harness=cell.harness,
        harness_scope=cell.scope,
        replicate=cell.replicate,
    )
