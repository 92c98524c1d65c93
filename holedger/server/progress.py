"""Progress of a command's trials on a terminal: `run open` (the seed baseline), `eval`
and `nominate` (the held-out scoring) show a bar per kind of trial on stderr, as the demo
does, and clear it when the work ends. A pipe or a log file gets nothing.

The service calls its ``trial_progress`` hook (when set) with (label, done, total) as
each trial of a request ends; :func:`terminal_progress` sets it for the length of a
command.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

ProgressHook = Callable[[str, int, int], None]


def trial_counter(
    hook: ProgressHook | None, split: str, total: int
) -> Callable[[Future[Any]], None] | None:
    """A done-callback for each trial future of a request: reports (label, done, total)."""
    if hook is None or total <= 0:
        return None
    label = "held-out trials (test, K each)" if split == "test" else f"{split} trials"
    lock = threading.Lock()
    done = [0]
    hook(label, 0, total)

    def one_ended(_: Future[Any]) -> None:
        with lock:
            done[0] += 1
            count = done[0]
        try:
            hook(label, count, total)
        except Exception:  # a progress bar never breaks an evaluation
            pass

    return one_ended


@contextmanager
def terminal_progress(service: Any) -> Iterator[None]:
    """Show the service's trials as progress bars on stderr while the body runs, when
    stderr is a terminal."""
    from holedger.output import console

    err = console(stderr=True)
    if not err.is_terminal:
        yield
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bars: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.description:<32}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as progress:

        def hook(label: str, done: int, total: int) -> None:
            if label not in bars or (done == 0 and progress.tasks[bars[label]].finished):
                bars[label] = progress.add_task(label, total=total)
            progress.update(bars[label], completed=done, total=total)

        previous = getattr(service, "trial_progress", None)
        service.trial_progress = hook
        try:
            yield
        finally:
            service.trial_progress = previous
