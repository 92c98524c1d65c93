"""The task's cases and verifier, for the replay checks that need them (leakage audit,
case membership, re-scoring).

Replay never trusts a local task blindly: the task named in RunOpened is loaded only when
it is available on this machine *and* its digest equals ``RunOpened.task_digest``;
otherwise the checks that need it say plainly that they were skipped and why.

A caller may hand the data in through :class:`~holedger.replay.inputs.CheckInputs`:
``task`` (a task name or folder to load instead of the pinned task id) or ``task_data``
(a ready :class:`TaskData`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from holedger.errors import HoledgerError
from holedger.replay.inputs import CaseData, CheckContext, TaskData

__all__ = ["CaseData", "TaskData", "task_data"]


def task_data(ctx: CheckContext) -> TaskData | str:
    """The run's task data, or the reason it is unavailable (loaded once per inputs)."""
    given = ctx.inputs.task_data
    if given is not None:
        return _pinned(given, ctx)
    name = ctx.inputs.task or ctx.opened.task_id
    key = (name, ctx.opened.task_id)
    loaded = ctx.inputs.loaded.get(key)
    if loaded is None:
        loaded = ctx.inputs.loaded[key] = _load(name, ctx.opened.task_id)
    return loaded if isinstance(loaded, str) else _pinned(loaded, ctx)


def _load(name: str, task_id: str) -> TaskData | str:
    load_task, digest_of = _tasks_api()
    if load_task is None or digest_of is None:
        return "the task loader (holedger.tasks) is not available"
    try:
        loaded = load_task(name)
        digest = str(digest_of(loaded.spec))
        raw = {split: list(loaded.cases(split)) for split in ("dev", "val", "test")}
        splits = {
            split: [CaseData(str(c.id), c.input, getattr(c, "expected", None)) for c in cases]
            for split, cases in raw.items()
        }
        by_id = {str(c.id): c for cases in raw.values() for c in cases}

        def verify(case_id: str, answer: Any) -> Fraction:
            return Fraction(loaded.verify(by_id[case_id], answer))
    except HoledgerError as exc:
        return f"task {name} is not available locally: {exc.message}"
    except (OSError, ValueError, KeyError) as exc:
        return f"task {name} could not be loaded: {exc}"
    return TaskData(str(task_id), digest, splits, verify)


def _pinned(data: TaskData, ctx: CheckContext) -> TaskData | str:
    if data.digest != ctx.opened.task_digest:
        return (
            f"the local task {ctx.opened.task_id} has digest {data.digest[:12]}, "
            f"not the run's pinned {ctx.opened.task_digest[:12]}"
        )
    return data


def _tasks_api() -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """``load_task`` and ``task_digest`` of holedger.tasks (None when it cannot load)."""
    try:
        from holedger.tasks import load_task, task_digest
    except ImportError:
        return None, None
    return load_task, task_digest
