"""What a remote executor reports when a trial's sandbox never gave a result."""

from __future__ import annotations

from holedger.errors import SandboxError, Unavailable


class TrialLost(SandboxError):
    """A trial's task never gave a result: its node or worker died, its result was lost,
    or it took too long. ``node`` is where it was placed (None: it never was). The server
    runs such a trial once more, elsewhere, under a new trial id, or records it as not run.
    """

    def __init__(self, message: str, node: str | None) -> None:
        super().__init__(message)
        self.node = node


class ExecutorGone(Unavailable):
    """The executor's cluster went away while trials ran: the evaluation fails with this,
    its request left as a stopped server leaves one (the run's next request, or ``holedger
    run recover``, records it with its trials as not run)."""
