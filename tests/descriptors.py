"""Descriptors as a long-running server sees them: hold many open, so the next ones a
test opens are numbered 1024 and up (the numbers select() refuses); count those a step
leaves open."""

from __future__ import annotations

import gc
import os
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def holding_descriptors(count: int = 1100) -> Iterator[list[int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = count + 100
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the descriptor limit ({hard}) is too low for this test")
    wanted = max(soft, need) if hard == resource.RLIM_INFINITY else min(max(soft, need), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        assert max(held) >= 1024
        yield held
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def descriptors_kept(step: Callable[[], None], rounds: int = 20) -> int:
    """How many more descriptors the process holds after ``rounds`` more calls of ``step``
    than before them, with the cyclic garbage collector off: only what ``step`` closes
    itself is released. The first call, before counting, may open what is kept for the
    whole process (module caches)."""
    step()
    gc.collect()
    gc.disable()
    try:
        before = open_descriptors()
        for _ in range(rounds):
            step()
        return open_descriptors() - before
    finally:
        gc.enable()
