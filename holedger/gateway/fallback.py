"""The event that stands for a call whose own event cannot be built or written.

The gateway bounds every number it records (gateway.limits, schemas.types), so a call's
GatewayCall always validates; should one still fail (a fault of the gateway's own), the
event writer does not stop: it records this refusal in its place, built only from the
gateway's own identifiers and constants, and goes on with the other calls.
"""

from __future__ import annotations

from typing import Any

from holedger.gateway.recorder import Events
from holedger.schemas.events import GatewayCall, TokenUsage

UNRECORDABLE_CODE = "event_unrecordable"


def refused_events(call: Any, reason: str) -> Events:
    """A GatewayCall recording ``call`` as refused (500 ``event_unrecordable``)."""
    safe = reason.encode("ascii", "backslashreplace").decode("ascii")
    event = GatewayCall(
        call_id=str(call.call_id),
        scope=call.scope,
        request_id=call.request_id,
        trial_id=call.trial_id,
        case_id=call.case_id,
        attempt=call.attempt,
        model_requested=None,
        model_served=None,
        allowed=False,
        reason=f"the call's event could not be recorded: {safe}",
        status=500,
        tokens=TokenUsage(),
        reserved=0,
        latency_ms=0,
        request_digest=None,
        response_digest=None,
        code=UNRECORDABLE_CODE,
    )
    return [("GatewayCall", event, "gateway")]
