"""Closing a run ends everything of it: the marks and the order a close follows.

``Ledger.close_run`` does, in this order:

1. marks the run closed in ``holedger_closed_runs`` (committed): from then on every token
   of the run reads as dead (``TokenRegistry`` loads the mark with a token's claims), and
   ``holedger token RUN`` refuses the run;
2. runs the ledger's close hooks: a gateway of this process refuses the run's calls from
   now on (403 ``run_closed``), waits for the run's calls in flight and writes their
   events, so each is recorded before RunClosed;
3. when a gateway of another process is serving this ledger (``holedger_gateways``), waits
   ``CLOSE_VISIBLE_WITHIN_S``, the longest a gateway's token cache may keep a claim, so
   that gateway too refuses the run before RunClosed is appended;
4. appends RunClosed and its Checkpoint. The ledger refuses any event after it
   (RunClosedError), whoever writes, so a call still in flight anywhere is recorded
   before RunClosed or not at all.

The one exception (``admit``): a batch of server-signed AuditControlEvaluated events, the
server's record of control evaluations made for an audit of the closed run, followed by
a Checkpoint; such an event is refused in an open run (docs/AUDITS.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, delete, insert, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from holedger.errors import RunClosedError, UsageError
from holedger.schemas.events import AFTER_CLOSE_TYPES

# A gateway's token cache keeps a claim at most this long (TokenRegistry.cache_ttl_s).
CLOSE_VISIBLE_WITHIN_S = 2.0

_metadata = MetaData()
closed_runs_table = Table(
    "holedger_closed_runs",
    _metadata,
    Column("run_id", String(36), primary_key=True),
    Column("closed_at", Integer, nullable=False),
)
gateways_table = Table(
    "holedger_gateways",
    _metadata,
    Column("instance_id", String(32), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Integer, nullable=False),
)


_ready: weakref.WeakSet[Engine] = weakref.WeakSet()


def create_tables(engine: Engine) -> None:
    """Create this module's tables once per engine (a ledger made before them lacks them)."""
    if engine not in _ready:
        _metadata.create_all(engine, checkfirst=True)
        _ready.add(engine)


def mark_closed(engine: Engine, run_id: str) -> None:
    """Mark ``run_id`` closed (idempotent): its tokens are dead from now on."""
    create_tables(engine)
    with contextlib.suppress(IntegrityError), engine.begin() as conn:
        conn.execute(insert(closed_runs_table).values(run_id=run_id, closed_at=int(time.time())))


def is_marked_closed(engine: Engine, run_id: str) -> bool:
    create_tables(engine)
    with engine.connect() as conn:
        row = conn.execute(
            select(closed_runs_table.c.run_id).where(closed_runs_table.c.run_id == run_id)
        ).first()
    return row is not None


def has_run_closed_event(engine: Engine, events_table: str, run_uuid: uuid.UUID) -> bool:
    """Whether the run holds a RunClosed event anywhere (not only as its last events)."""
    return run_closed_version(engine, events_table, run_uuid) is not None


def run_closed_version(engine: Engine, events_table: str, run_uuid: uuid.UUID) -> int | None:
    """The stream version (seq + 1) of the run's first RunClosed event, or None."""
    sqlite = engine.dialect.name == "sqlite"
    rid: object = run_uuid.bytes if sqlite else run_uuid
    sql = text(
        f"SELECT MIN(originator_version) FROM {events_table} "
        "WHERE originator_id = :rid AND topic = 'RunClosed'"
    )
    with engine.connect() as conn:
        row = conn.execute(sql, {"rid": rid}).first()
    return None if row is None or row[0] is None else int(row[0])


def register_gateway(engine: Engine) -> str:
    """Record a gateway serving this ledger from this process; returns its instance id."""
    create_tables(engine)
    instance = uuid.uuid4().hex
    with engine.begin() as conn:
        conn.execute(
            insert(gateways_table).values(
                instance_id=instance,
                host=socket.gethostname()[:255],
                pid=os.getpid(),
                started_at=int(time.time()),
            )
        )
    return instance


def unregister_gateway(engine: Engine, instance: str) -> None:
    with contextlib.suppress(Exception), engine.begin() as conn:
        conn.execute(delete(gateways_table).where(gateways_table.c.instance_id == instance))


def gateway_elsewhere(engine: Engine) -> bool:
    """Whether a gateway of another live process serves this ledger (one of a process
    that is gone, on this host, is forgotten)."""
    create_tables(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(gateways_table.c.instance_id, gateways_table.c.host, gateways_table.c.pid)
        ).all()
    here = socket.gethostname()[:255]
    for instance, host, pid in rows:
        if host == here and pid == os.getpid():
            continue
        if host == here and not _alive(int(pid)):
            unregister_gateway(engine, str(instance))
            continue
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def admit(run_id: str, closed: bool, items: Sequence[tuple[str, Any, str]]) -> bool:
    """Whether a batch for run ``run_id`` is an after-close batch (server-signed events of
    AFTER_CLOSE_TYPES only, the writer then adds a Checkpoint); raises RunClosedError for
    anything else after RunClosed, and UsageError for such an event in an open run."""
    after = all(etype in AFTER_CLOSE_TYPES and role == "server" for etype, _, role in items)
    if closed and not after:
        raise RunClosedError(
            f"run {run_id} is closed: nothing more is recorded in it", hint="open a new run"
        )
    if not closed and any(etype in AFTER_CLOSE_TYPES for etype, _, _ in items):
        raise UsageError(
            f"run {run_id} is open: an audit's control evaluations are recorded only after "
            "RunClosed",
            hint="audit the run once it is closed",
        )
    return after
