"""Export the JSON Schema of every holedger model into ``holedger/schemas/json/``.

Run ``python -m holedger.schemas.export`` after changing a model; ``--check`` exits 1
(and names the files) when the committed schemas differ from the models, which is what
the test suite runs. One file per model, ``<ModelName>.json``, pretty-printed with
sorted keys so diffs stay readable.

The models are every pydantic model defined in a module of ``holedger.schemas`` (the
envelope, every event payload and the parts they share, task terms, ...) plus the replay
report; models added there later are picked up without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import holedger.schemas

SCHEMA_DIR = Path(__file__).parent / "json"
EXTRA_MODULES = ("holedger.replay.report",)
SKIP_MODULES = frozenset({"holedger.schemas.export"})
SKIP_MODELS = frozenset({"Model"})  # the shared base class: no fields of its own


def _modules() -> Iterator[str]:
    for info in pkgutil.iter_modules(holedger.schemas.__path__, "holedger.schemas."):
        if info.name not in SKIP_MODULES:
            yield info.name
    yield from EXTRA_MODULES


def models() -> dict[str, type[BaseModel]]:
    """Every exported model by name (names are unique across the exported modules)."""
    found: dict[str, type[BaseModel]] = {}
    for module_name in _modules():
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module_name
                and not name.startswith("_")
                and name not in SKIP_MODELS
            ):
                if name in found and found[name] is not value:
                    raise ValueError(f"two exported models are named {name}")
                found[name] = value
    return dict(sorted(found.items()))


def render(model: type[BaseModel]) -> str:
    schema: dict[str, Any] = model.model_json_schema(mode="validation")
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    return {f"{name}.json": render(model) for name, model in models().items()}


def drift(directory: Path = SCHEMA_DIR) -> list[str]:
    """Files that are missing, stale or left over, as short lines."""
    want = expected_files()
    have = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    problems = [f"missing {name}" for name in sorted(set(want) - have)]
    problems += [f"left over {name}" for name in sorted(have - set(want))]
    for name in sorted(set(want) & have):
        if (directory / name).read_text(encoding="utf-8") != want[name]:
            problems.append(f"stale {name}")
    return problems


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Write every schema and remove schemas of models that no longer exist."""
    directory.mkdir(parents=True, exist_ok=True)
    want = expected_files()
    for stale in directory.glob("*.json"):
        if stale.name not in want:
            stale.unlink()
    for name, text in want.items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return sorted(want)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m holedger.schemas.export")
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 on any")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="output directory")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift(args.dir)
        for line in problems:
            print(line)
        if problems:
            print("regenerate with: python -m holedger.schemas.export", file=sys.stderr)
        return 1 if problems else 0
    names = write(args.dir)
    print(f"wrote {len(names)} schemas to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
