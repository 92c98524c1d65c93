"""A replay worker process: ``python -m holedger.replay.worker``.

It reads chunk jobs (replay.chunks.ChunkJob) from its standard input and writes each
one's summary (``check_chunk``'s answer) to its standard output, in order, until its input
ends. Each message is a frame: its length as 8 bytes, big-endian, then a pickle. Only
replay.parallel starts it, and talks to it over those two pipes.
"""

from __future__ import annotations

import pickle
import sys
from typing import IO

_LENGTH = 8


def write_frame(out: IO[bytes], data: bytes) -> None:
    """Write one frame whole (``out`` may be unbuffered: a write may take only part)."""
    for part in (len(data).to_bytes(_LENGTH, "big"), data):
        view = memoryview(part)
        while view:
            written = out.write(view)
            view = view[written if written is not None else len(view) :]
    out.flush()


def read_frame(source: IO[bytes]) -> bytes | None:
    """The next frame's bytes, or None at the end of the input."""
    head = _read_exactly(source, _LENGTH)
    if head is None:
        return None
    data = _read_exactly(source, int.from_bytes(head, "big"))
    if data is None:
        raise EOFError("input ended inside a frame")
    return data


def _read_exactly(source: IO[bytes], size: int) -> bytes | None:
    data = source.read(size)
    if not data:
        return None
    while len(data) < size:
        more = source.read(size - len(data))
        if not more:
            raise EOFError("input ended inside a frame")
        data += more
    return data


def main() -> None:
    from holedger.replay.chunks import check_chunk

    jobs, results = sys.stdin.buffer, sys.stdout.buffer
    while (data := read_frame(jobs)) is not None:
        write_frame(results, pickle.dumps(check_chunk(pickle.loads(data)), protocol=5))


if __name__ == "__main__":
    main()
