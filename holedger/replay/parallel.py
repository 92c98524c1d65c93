"""Feeding a run's records to the verifier a chunk at a time, in one process or several.

The first record (RunOpened, which says whom to trust) goes through the verifier's
reference pass alone. Then the records go in chunks (LOCAL_CHUNK records in one process,
CHUNK with workers, or fewer when they reach CHUNK_BYTES): each chunk is checked whole by
``chunks.check_chunk``, here or in a worker process, and its summary is fed to the
verifier strictly in stream order (``feed_chunk`` of the engine's ``_Verifier``), which
takes it only where it continues the run exactly and otherwise checks that chunk record
by record. So the report is the one the reference pass alone gives, whichever process
checked which chunk.

With workers, a chunk goes to the worker with the fewest chunks waiting, while that is
fewer than WAITING_PER_WORKER; otherwise this process checks it itself, between reading
records and taking summaries. So the number of processes asked for stays busy, none more,
and the share this process checks adapts to how much else it has to do.

Each worker has a pipe of its own each way, written and read by this process's one
thread: no feeder threads, which would have to win the GIL from the checking thread for
every pipe-full of a chunk while the worker waits. The pipes are made large enough
(Linux) to hold every chunk a worker may have waiting, so a send never waits either.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import IO, Protocol

from holedger.errors import HoledgerError
from holedger.replay.chunks import ChunkJob, ChunkSummary, check_chunk
from holedger.replay.worker import read_frame, write_frame

CHUNK = 128  # records per chunk sent to a worker: the last ones sent are what the end waits for
LOCAL_CHUNK = 256  # records per chunk in one process (measured a little faster than 128)
CHUNK_BYTES = 256 * 1024
WAITING_PER_WORKER = 2  # chunks waiting for one worker before this process checks one itself
WINDOW = 32  # chunks read ahead of the in-order pass at most
PIPE_BYTES = 1 << 20  # asked for; the job limit follows from what the pipe really holds


class Verifier(Protocol):
    """The in-order pass records are fed to (the engine's ``_Verifier``)."""

    def feed(self, raw: bytes) -> None:
        """Check one record by itself."""

    def chunk_job(self, records: list[bytes]) -> ChunkJob | None:
        """A job checking ``records`` whole, or None while the run is not open."""

    def feed_chunk(self, job: ChunkJob, summary: ChunkSummary | None) -> None:
        """Take a chunk's summary where it continues the pass, else check it by record."""


def _chunks(records: Iterable[bytes], count: int, size: int) -> Iterator[list[bytes]]:
    """Consecutive records: at most ``count`` and at most ``size`` bytes at a time (a
    record larger than that alone)."""
    it = iter(records)
    while batch := list(islice(it, count)):
        if sum(map(len, batch)) <= size:
            yield batch
            continue
        chunk: list[bytes] = []
        held = 0
        for raw in batch:
            if chunk and held + len(raw) > size:
                yield chunk
                chunk, held = [], 0
            chunk.append(raw)
            held += len(raw)
        yield chunk


def _opened(verifier: Verifier, it: Iterator[bytes]) -> None:
    """Feed the first record through the reference pass: it opens the run."""
    for raw in it:
        verifier.feed(raw)
        return


def feed_in_chunks(verifier: Verifier, records: Iterable[bytes]) -> None:
    """Feed ``records`` to ``verifier`` in order, in this process, a chunk at a time."""
    it = iter(records)
    _opened(verifier, it)
    for chunk in _chunks(it, LOCAL_CHUNK, CHUNK_BYTES):
        job = verifier.chunk_job(chunk)
        if job is None:
            for raw in chunk:
                verifier.feed(raw)
        else:
            verifier.feed_chunk(job, check_chunk(job))


# ------------------------------------------------------------------ worker processes


class _Worker:
    """A worker process (holedger.replay.worker) and its two pipes."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))
        self.process = subprocess.Popen(
            # -P: the working directory is not put on the worker's import path, so a
            # holedger/ (or pickle.py, cryptography/...) where replay is run is never
            # imported in place of the code this process runs.
            [sys.executable, "-P", "-m", "holedger.replay.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: a summary is read only when select says it is there
            env=env,
            cwd=root,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.jobs: IO[bytes] = self.process.stdin
        self.results: IO[bytes] = self.process.stdout
        self.capacity = min(_grow(self.jobs.fileno()), _grow(self.results.fileno()))
        self.waiting = 0  # jobs sent, summaries not yet received

    def send(self, job: ChunkJob) -> None:
        write_frame(self.jobs, pickle.dumps(job, protocol=5))
        self.waiting += 1

    def ready(self) -> bool:
        """Whether the oldest job's summary can be received without waiting."""
        poller = select.poll()  # not select(): it refuses descriptors of 1024 and up
        poller.register(self.results.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def receive(self) -> ChunkSummary | None:
        """The summary of the oldest job sent (summaries come back in order)."""
        data = read_frame(self.results)
        if data is None:
            status = self.process.wait()
            raise HoledgerError(
                f"a replay worker process ended (exit status {status})",
                hint="replay again, or with --workers 1",
            )
        summary: ChunkSummary | None = pickle.loads(data)
        self.waiting -= 1
        return summary

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.jobs.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.results.close()


def _grow(fd: int) -> int:
    """Ask for a large pipe buffer; the size it has."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except (ImportError, AttributeError, OSError):
        return 64 * 1024  # what a pipe holds where its size cannot be read


class _Pool:
    """Worker processes kept for the life of this process, for one replay at a time.

    Starting a worker (a Python that imports the schemas) takes a few tenths of a
    second; a process that replays again reuses them. A replay that finds the pool busy
    (another thread replaying) starts workers of its own.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []

    def take(self, count: int) -> list[_Worker]:
        for worker in self.workers:
            if worker.process.poll() is not None:
                self.discard()
                break
        while len(self.workers) < count:
            self.workers.append(_Worker())
        return self.workers[:count]

    def discard(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []


_POOL = _Pool()
atexit.register(_POOL.discard)


Pending = tuple[ChunkJob | list[bytes], "_Worker | ChunkSummary | None"]


def feed_in_parallel(verifier: Verifier, records: Iterable[bytes], workers: int) -> None:
    """Feed ``records`` to ``verifier`` in order, checking chunks in ``workers``
    processes: this one and ``workers - 1`` others."""
    shared = _POOL.lock.acquire(blocking=False)
    own: list[_Worker] = []
    try:
        if shared:
            pool = _POOL.take(workers - 1)
        else:
            pool = own = [_Worker() for _ in range(workers - 1)]
        try:
            _feed(verifier, iter(records), pool)
        except BaseException:
            # Summaries may still be on their way: these workers cannot be reused.
            if shared:
                _POOL.discard()
            raise
    finally:
        for worker in own:
            worker.close()
        if shared:
            _POOL.lock.release()


def _feed(verifier: Verifier, it: Iterator[bytes], pool: list[_Worker]) -> None:
    _opened(verifier, it)
    window: deque[Pending] = deque()
    # A job is sent only while the worker's pipe holds every job it may have waiting.
    size = min(CHUNK_BYTES, min(w.capacity for w in pool) // (WAITING_PER_WORKER + 1))

    def take(block: bool) -> None:
        while window:
            job, summary = window[0]
            if isinstance(summary, _Worker):
                if not (block or summary.ready()):
                    return
                summary = summary.receive()
            window.popleft()
            if isinstance(job, list):  # no job: the run was not open when it was read
                for raw in job:
                    verifier.feed(raw)
            else:
                verifier.feed_chunk(job, summary)
            block = False

    for chunk in _chunks(it, CHUNK, size):
        job = verifier.chunk_job(chunk)
        if job is None:
            take(block=True)  # the verifier may open the run on an earlier chunk
            job = verifier.chunk_job(chunk)
        if job is None:
            window.append((chunk, None))
        else:
            worker = min(pool, key=lambda w: w.waiting)
            if worker.waiting < WAITING_PER_WORKER and sum(map(len, chunk)) <= size:
                worker.send(job)
                window.append((job, worker))
            else:
                window.append((job, check_chunk(job)))
        take(block=len(window) > WINDOW)
    while window:
        take(block=True)
