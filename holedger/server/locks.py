"""The lock files of the server: a run's nomination and each request's evaluation.

A request's lock is held from before its EvaluationRequested is recorded until its
projection is: a request without a projection whose lock is free was left by a server
that stopped (``RunService.recover``). Nominations of one run take turns on theirs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from holedger.errors import Unavailable


@contextlib.contextmanager
def nomination_lock(path: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive lock on ``path`` (kept); without ``wait``, Unavailable when held."""
    with flock(path, wait=wait, remove=False) as held:
        if not held:
            raise Unavailable(
                "this run's nomination is already under way",
                hint="wait for it: GET the run until its state is closed",
            )
        yield


@contextlib.contextmanager
def request_lock(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold a request's lock file while its evaluation runs (see RunService.recover).

    Yields whether it is held (always, with ``wait``). The holder removes the file before
    letting go; one who opened it before then finds, once it holds the lock, the request
    recorded, since the state is read again under the lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with flock(path, wait=wait, remove=True) as held:
        yield held


@contextlib.contextmanager
def flock(path: Path, *, wait: bool, remove: bool) -> Iterator[bool]:
    """An exclusive flock on the file at ``path``; yields whether it is held (always,
    with ``wait``). With ``remove`` the holder removes the file before letting go, and a
    lock taken on a file so removed does not count: the lock is the file now at the path."""
    while True:
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            if remove and not same_file(handle.fileno(), path):
                # Its holder removed it before letting go. Without waiting, say it is
                # held (its holder has just finished; the caller looks again next time).
                if wait:
                    continue
                yield False
                return
            try:
                yield True
            finally:
                if remove:
                    path.unlink(missing_ok=True)
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return


def same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
