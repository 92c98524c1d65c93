"""Database failures of the ledger as one-line errors naming the ledger and what to do:
a damaged or foreign SQLite file, an unreachable server, a full disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from holedger.errors import ConfigError, HoledgerError, StorageError

_FULL = ("disk is full", "no space left", "disk quota exceeded")
_DAMAGED = (
    "malformed",
    "not a database",
    "file is encrypted",
    "disk i/o error",
    "database corrupt",
    "no such table",
    "no such column",
)
_UNREACHABLE = ("connection failed", "connection refused", "could not connect", "timeout expired")
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first (DB-API errors wrapped by SQLAlchemy
    and eventsourcing), without loops."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        orig = getattr(current, "orig", None)
        current = (
            orig if isinstance(orig, BaseException) else current.__cause__ or current.__context__
        )
    return seen


def _is_storage(exc: BaseException) -> bool:
    module = type(exc).__module__.split(".", 1)[0]
    return module in ("sqlite3", "psycopg", "sqlalchemy", "eventsourcing", "_sqlite3")


def redact(url: str) -> str:
    """``url`` without its user and password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def _disk_full(url: str | None) -> bool:
    """Whether the disk holding a SQLite ledger has no free block left (SQLite may then
    report only a "disk I/O error", when it cannot make its journal)."""
    if not url or not url.startswith("sqlite:///"):
        return False
    folder = Path(url.removeprefix("sqlite:///").split("?", 1)[0]).parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail == 0 or (st.f_favail == 0 and st.f_files > 0)


def _where(url: str | None) -> str:
    if not url:
        return "the ledger"
    if url.startswith("sqlite:///"):
        return f"the ledger file {url.removeprefix('sqlite:///').split('?', 1)[0]}"
    return f"the ledger at {redact(url)}"


def _db_message(chain: list[BaseException]) -> str:
    """The innermost database error's own words, on one line."""
    for exc in reversed(chain):
        if _is_storage(exc) or isinstance(exc, OSError):
            text = str(exc).split("\n[SQL:", 1)[0]
            text = " ".join(text.split())
            if text:
                return text
    return " ".join(str(chain[0]).split()) or type(chain[0]).__name__


def storage_error(exc: BaseException, ledger_url: str | None) -> HoledgerError | None:
    """A one-line error for a failure of the ledger's database, or None if it is not one."""
    chain = _chain(exc)
    os_error = next((e for e in chain if isinstance(e, OSError)), None)
    if any(_is_storage(e) for e in chain):
        message = _db_message(chain)
        low = message.lower()
        where = _where(ledger_url)
        full = any(w in low for w in _FULL) or _disk_full(ledger_url)
        if full or (os_error and os_error.errno in _FULL_ERRNOS):
            return StorageError(
                f"{where} cannot be used: its disk is full ({message})",
                hint="free space on its disk, then run the command again",
            )
        if any(w in low for w in _DAMAGED):
            return ConfigError(
                f"{where} is damaged or not a holedger ledger: {message}",
                hint="restore it from a backup, or move it aside and run 'holedger init' "
                "to start an empty ledger (bundles from 'holedger export' verify without it)",
            )
        if any(w in low for w in _UNREACHABLE):
            return ConfigError(
                f"cannot reach {where}: {message}",
                hint="start the database server, or check --ledger / HOLEDGER_LEDGER",
            )
        return StorageError(
            f"{where} failed: {message}",
            hint="check the database (and its disk), then run the command again",
        )
    return None
