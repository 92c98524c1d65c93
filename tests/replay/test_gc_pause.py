"""Replay pauses the cyclic garbage collector and gives it back as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from holedger.replay.engine import _no_cyclic_gc, verify_log


@pytest.fixture
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_overlapping_pauses_restore_the_collector_once_the_last_ends(gc_enabled: None) -> None:
    first, second = _no_cyclic_gc(), _no_cyclic_gc()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the other replay is still running
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(gc_enabled: None) -> None:
    gc.disable()
    with _no_cyclic_gc():
        pass
    assert not gc.isenabled()


class _NoBlobs:
    def blob(self, digest: str) -> bytes | None:
        return None

    def redacted(self, digest: str) -> bool:
        return False


def test_replay_restores_the_collector_even_when_it_fails(gc_enabled: None) -> None:
    def records() -> Iterator[bytes]:
        assert not gc.isenabled()  # paused while records stream
        yield b"not a record"
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError):
        verify_log("5cc5c15a-c7bd-4381-be43-6f071cd22836", records(), _NoBlobs(), (), None)
    assert gc.isenabled()
