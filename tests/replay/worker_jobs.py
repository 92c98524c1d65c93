"""Shared helpers of the replay tests."""

from __future__ import annotations

import pytest

from holedger.replay import parallel
from holedger.replay.chunks import ChunkJob


def count_worker_jobs(monkeypatch: pytest.MonkeyPatch) -> list[ChunkJob]:
    """From now until ``monkeypatch`` is undone, every chunk job sent to a replay worker
    process, in order: a test that means to check chunks in workers asserts that some
    were sent (a limit that keeps every chunk in this process passes silently else)."""
    sent: list[ChunkJob] = []
    send = parallel._Worker.send

    def counting(worker: parallel._Worker, job: ChunkJob) -> None:
        sent.append(job)
        send(worker, job)

    monkeypatch.setattr(parallel._Worker, "send", counting)
    return sent
