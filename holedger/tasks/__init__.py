"""holedger.tasks: task specs, split manifests and digests, verifiers, the bundled demo task.

The API the other rooms use: :func:`load_task` (a bundled name or a folder with
``task.toml``) returns a :class:`LoadedTask` whose every digest has been re-checked;
:func:`task_digest` is the SHA-256 of the whole spec that a run pins.
"""

from holedger.tasks.loader import (
    Case,
    Check,
    LoadedTask,
    bundled_tasks,
    load_task,
    task_digest,
    verify_task,
)

__all__ = [
    "Case",
    "Check",
    "LoadedTask",
    "bundled_tasks",
    "load_task",
    "task_digest",
    "verify_task",
]
