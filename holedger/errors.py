"""One exception hierarchy; every message is one line a user can act on.

Each error carries an optional ``hint`` (what to do next) and an ``exit_code``
that the command line uses: 1 for a failed verification, 2 for bad usage or a
missing object, 3 for everything else that went wrong.
"""

from __future__ import annotations

from holedger.untrusted import escape_text


class HoledgerError(Exception):
    """Base of every error holedger raises on purpose."""

    exit_code = 3

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def one_line(self) -> str:
        """The message and the hint, on one line, as the CLI prints it."""
        text = self.message.replace("\n", " ")
        if self.hint:
            text += f" (hint: {self.hint})"
        return escape_text(text)


class UsageError(HoledgerError):
    """The caller asked for something malformed."""

    exit_code = 2


class NotFoundError(HoledgerError):
    """A run, candidate, task, key or blob does not exist."""

    exit_code = 2


class ConfigError(HoledgerError):
    """The home, the ledger URL or a key file is missing or unusable."""

    exit_code = 2


class CanonicalError(HoledgerError):
    """A value cannot be encoded as, or bytes are not, holedger canonical JSON."""


class SchemaError(HoledgerError):
    """A payload does not match its event type's model, or the type is unknown."""


class VerificationError(HoledgerError):
    """A signature, hash, proof or checkpoint does not verify."""

    exit_code = 1


class LedgerConflictError(HoledgerError):
    """Another writer appended to the same run first; re-read and decide again."""


class PolicyError(HoledgerError):
    """A request breaks the run's protocol, budget or disclosure policy."""


class RunClosedError(PolicyError):
    """The run has closed (RunClosed is recorded): nothing more is appended to it."""


class BudgetExceededError(PolicyError):
    """A request does not fit the remaining budget."""


class SandboxError(HoledgerError):
    """A sandbox backend is unavailable or failed to start."""


class StorageError(HoledgerError):
    """The ledger's database or a file of the home cannot be read or written (a full disk,
    a failing database server)."""


class BundleError(HoledgerError):
    """A run bundle is malformed, of an unknown version, or unsafe to read."""

    exit_code = 2


class Unavailable(HoledgerError):
    """Not now, nothing recorded: the server is stopping, or the run is busy (retry)."""

    exit_code = 3
