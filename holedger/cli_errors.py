"""What the command line says about an error nothing below it turned into a HoledgerError.

Storage errors (a damaged SQLite ledger, an unreachable PostgreSQL, a full disk) and file
system errors become one line naming the file or the ledger and what to do, with the exit
code of their kind; anything else is an internal error, one line too. A traceback is shown
only when ``HOLEDGER_TRACEBACK=1`` asks for it.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from holedger.errors import ConfigError, HoledgerError, NotFoundError, StorageError
from holedger.ledger.failures import storage_error

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

TRACEBACK_ENV = "HOLEDGER_TRACEBACK"


def show_traceback() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def file_error(exc: OSError) -> HoledgerError:
    """A file system error as one line naming the file."""
    name = exc.filename if exc.filename is not None else None
    what = f"{name}" if name is not None else "a file"
    reason = exc.strerror or str(exc)
    if exc.errno in _FULL_ERRNOS:
        return StorageError(
            f"cannot write {what}: {reason}",
            hint="free space on its disk, then run the command again",
        )
    if exc.errno == errno.ENOENT:
        return NotFoundError(f"{what} does not exist", hint="check the path")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ConfigError(
            f"permission denied: {what}", hint="check the file's owner and mode, or the user"
        )
    if exc.errno == errno.EROFS:
        return ConfigError(
            f"{what} is on a read-only file system", hint="use a home on a writable disk"
        )
    return StorageError(f"{what}: {reason}", hint="check the file and its disk")


def internal_error(exc: BaseException) -> HoledgerError:
    text = " ".join(str(exc).split())[:300]
    return HoledgerError(
        f"internal error: {type(exc).__name__}" + (f": {text}" if text else ""),
        hint=f"this is a bug in holedger; run again with {TRACEBACK_ENV}=1 to see where, "
        "and report it",
    )


def one_line_error(exc: BaseException, settings: Any) -> HoledgerError:
    """What the command line prints for ``exc``, which is not a HoledgerError."""
    url = getattr(settings, "ledger_url", None)
    found = storage_error(exc, url)
    if found is not None:
        return found
    os_error = exc if isinstance(exc, OSError) else None
    if os_error is not None:
        return file_error(os_error)
    return internal_error(exc)
