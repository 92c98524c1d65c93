"""Crash safety: a writer killed with SIGKILL mid-append never leaves a torn ledger.

A forked writer appends batches (1 to 4 events, plus automatic checkpoints) as fast as
it can; once it has committed its first batch, it is killed with SIGKILL after a short
random delay, so the kill lands anywhere in its stream of transactions. Each time, the ledger is
reopened and replayed: every committed event verifies (only "not closed" may fail), every
batch is either wholly present or wholly absent, and the next writer appends on top.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .recorded_run import open_run
from .workers import KEY_NAME, append_batches_forever

KILLS = 60
RUNS = 6  # the writers rotate over a few runs, so each replay stays short


def _check_run(ledger: Ledger, run_id: str) -> int:
    report = replay_run(ledger, run_id, checks=())
    assert report.failed_checks() == ["closed"], report.failures[:3]
    assert {f.check for f in report.failures} == {"closed"}
    assert f"verified through seq {report.events - 1}" in report.failures[0].reason
    batches: dict[str, set[int]] = defaultdict(set)
    sizes: dict[str, int] = {}
    for rec in ledger.records(run_id):
        if rec.type == "GatewayCall":
            batch, index, _, size = str(rec.payload["call_id"]).split("-")
            assert int(index) not in batches[batch], "an event stored twice"
            batches[batch].add(int(index))
            sizes[batch] = int(size)
    torn = {b: sorted(got) for b, got in batches.items() if len(got) != sizes[b]}
    assert not torn, f"half-written batches: {torn}"
    return report.events


def test_sigkilled_writer_never_tears_the_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    key = SigningKey.generate(KEY_NAME)
    ledger = Ledger.open(url, key, checkpoint_interval=16)
    run_ids = [open_run(ledger, f"crash-{i}") for i in range(RUNS)]
    ledger.close()
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(9162)
    events = dict.fromkeys(run_ids, 1)
    grew = 0
    for kill in range(KILLS):
        run_id = run_ids[kill % RUNS]
        started = ctx.Event()
        writer = ctx.Process(
            target=append_batches_forever,
            args=(url, key.seed(), run_id, kill * 100_000, started),
        )
        writer.start()
        # Kill at a random moment while it is appending (after its first commit).
        assert started.wait(timeout=120), "the writer never committed a batch"
        time.sleep(rng.uniform(0.0, 0.15))
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        assert writer.exitcode == -signal.SIGKILL  # it was still writing when killed
        reopened = Ledger.open(url, key, checkpoint_interval=16, create_tables=False)
        try:
            count = _check_run(reopened, run_id)
        finally:
            reopened.close()
        grew += count > events[run_id]
        events[run_id] = count
    assert grew == KILLS  # every writer committed before it was killed
    final = Ledger.open(url, key, checkpoint_interval=16, create_tables=False)
    try:
        for run_id in run_ids:
            final.close_run(run_id)
            report = replay_run(final, run_id, checks=())
            assert report.verified, report.failures[:3]
    finally:
        final.close()
