"""A refusal of the gateway: the status, the OpenAI error type and code, and what to record.

Each wire format renders a refusal in its own error shape (``WireFormat.error_body``);
the OpenAI type is mapped to the format's own type there.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Denial(Exception):
    status: int
    err_type: str
    code: str
    message: str
    param: str | None = None
    safety: str | None = None
    extra_runs: list[str] = field(default_factory=list)
    recorded: bool = False
    retry: bool = False  # nothing was forwarded and trying again may succeed


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> Denial:
    """A 400 for a request the gateway will not forward as it is."""
    return Denial(400, "invalid_request_error", code, message, param=param)
