"""One request as it goes through the gateway's checks, and who may make it.

A :class:`Call` carries what its GatewayCall will record (attribution, model, bodies,
reservation) and where it stands (admitted, forwarded, recorded, responded), so each
stage (admission, metering, forwarding, streaming, the event writer) reads and sets the
same object and a fault at any point knows what is left to do.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Literal

from holedger.gateway.formats import CHAT, WireFormat
from holedger.gateway.tokens import TokenClaims
from holedger.schemas.events import GatewayBudgetState, PresentedToken, TokenUsage

ZERO = TokenUsage()


@dataclass(frozen=True)
class CallerBinding:
    """Who may call on one listener (a trial's unix socket): calls with any other token
    are refused as smuggled."""

    run_id: str
    scope: Literal["target", "optimizer"]
    trial_id: str | None = None
    request_id: str | None = None
    case_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class TrialUsage:
    """A trial's gateway calls so far: their count, their token sum, and whether none of
    them was still in flight when this was read."""

    tokens: TokenUsage
    calls: int
    complete: bool
    # Calls that ended in an error, by error code (else reason, else "status N").
    failed: dict[str, int] = field(default_factory=dict)


@dataclass
class Call:
    """One request as it goes through the checks; becomes one GatewayCall."""

    call_id: str
    t0: float
    endpoint: str
    fmt: WireFormat = CHAT
    run_id: str | None = None
    scope: Literal["target", "optimizer"] = "target"
    request_id: str | None = None
    trial_id: str | None = None
    case_id: str | None = None
    attempt: int | None = None
    stream: bool = False
    model_requested: str | None = None
    model_served: str | None = None
    request_bytes: bytes = b""
    reserved: int = 0
    prompt_bound: int = 0
    max_tokens_imposed: int | None = None
    reservation_index: int | None = None
    budget: GatewayBudgetState | None = None
    presented: PresentedToken | None = None
    tracked: bool = False  # counted in its trial's calls in flight
    admitted: bool = False  # holds room in the EventRoom until its event is submitted
    forwarded: bool = False  # handed to the upstream (it may have done the work)
    recorded: bool = False  # its GatewayCall has been handed to the writer
    responded: bool = False  # the response has started (a streamed one is under way)
    gated: str | None = None  # the run whose calls in flight count this one (RunGate)

    def attribute(self, claims: TokenClaims | CallerBinding) -> None:
        self.run_id = claims.run_id
        self.scope = claims.scope
        self.request_id = claims.request_id
        self.trial_id = claims.trial_id
        self.case_id = claims.case_id
        self.attempt = claims.attempt

    def id_header(self) -> tuple[bytes, bytes]:
        """The response header that names this call's GatewayCall."""
        return (b"x-holedger-call-id", self.call_id.encode())


class CallIds:
    """Unique call ids without a system call each: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"
