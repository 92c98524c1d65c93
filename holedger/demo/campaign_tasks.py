"""A campaign's copy of a task with a smaller test split (GRID.toml ``test_cases = N``).

Held-out scoring is most of a small grid's work: every run scores its nominee on every
test case K times (officeqa-lite: 48 x 3 = 144 trials, 12 runs 1,728). With
``test_cases = N`` the campaign runs each of its tasks as a copy whose test split keeps N
of the task's test cases (every (size // N)-th, in order of the kind its expected answer
names, when it names one, then of id, so each kind of question keeps about its share):
the same seed, dev and val cases, verifier, K, band and prepared edits, its own id
``TASK-testN`` and its own pinned digests (:mod:`holedger.tasks.pinning`).

The copy is a task of its own: its runs pin it, replay loads it from its folder, and no
analysis mixes it with the full task. It is written once into ``HOME/campaigns/tasks/``
and is byte-identical whenever it is made again, so a resumed campaign finds its runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from holedger.config import Settings
from holedger.errors import UsageError

SUFFIX = "-test"


def derived_name(task_id: str, cases: int) -> str:
    return f"{task_id}{SUFFIX}{cases}"


def cut_test_split(stored: list[dict[str, Any]], cases: int) -> list[str]:
    """The ids of the ``cases`` test cases kept: every (len // cases)-th in order of
    (the kind the expected answer names, if any; id)."""

    def key(case: dict[str, Any]) -> tuple[str, str]:
        expected = case.get("expected")
        kind = expected.get("kind") if isinstance(expected, dict) else None
        return (str(kind or ""), str(case["id"]))

    ordered = [str(c["id"]) for c in sorted(stored, key=key)]
    if not 1 <= cases <= len(ordered):
        raise UsageError(
            f"test_cases = {cases}: the task has {len(ordered)} test cases",
            hint=f"give 1 to {len(ordered)}",
        )
    return ordered[:: len(ordered) // cases][:cases]


def derived_task(cfg: Settings, ref: str, cases: int) -> Path:
    """The folder of ``ref``'s copy with ``cases`` test cases (made when missing)."""
    from holedger.tasks.loader import TASK_FILE, find_task, read_spec
    from holedger.tasks.pinning import pin_task

    source = find_task(ref)
    spec = read_spec(source)
    name = derived_name(spec.id, cases)
    dest = cfg.home / "campaigns" / "tasks" / name
    if (dest / TASK_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".task-", dir=dest.parent))
    try:
        copy = work / name
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        test_file = copy / spec.splits.cases_dir / "test.json"
        stored = json.loads(test_file.read_text(encoding="utf-8"))
        kept = set(cut_test_split(stored, cases))
        text = json.dumps([c for c in stored if c["id"] in kept], indent=1, sort_keys=True)
        test_file.write_text(text + "\n", encoding="utf-8")
        spec_file = copy / TASK_FILE
        toml = spec_file.read_text(encoding="utf-8")
        toml, found = re.subn(r'^id = ".*"$', f'id = "{name}"', toml, count=1, flags=re.M)
        if not found:
            raise UsageError(f"task {spec.id}: its {TASK_FILE} has no 'id = ...' line to copy")
        toml = re.sub(
            r'^(title = ".*)"$',
            lambda m: f'{m.group(1)} (test split cut to {cases} cases for a campaign)"',
            toml,
            count=1,
            flags=re.M,
        )
        spec_file.write_text(toml, encoding="utf-8")
        pin_task(copy)
        try:
            os.rename(copy, dest)
        except OSError:
            if not (dest / TASK_FILE).is_file():  # not another process making the same copy
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def task_refs(cfg: Settings, tasks: list[str], cases: int | None) -> dict[str, str]:
    """Each grid task -> what the campaign loads: the task, or its copy with ``cases``
    test cases."""
    if cases is None:
        return {ref: ref for ref in tasks}
    return {ref: str(derived_task(cfg, ref, cases)) for ref in tasks}
