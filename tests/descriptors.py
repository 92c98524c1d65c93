"""Hold many open descriptors, so the next ones a test opens are numbered 1024 and up
(the numbers select() refuses), as in a long-running server."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
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
