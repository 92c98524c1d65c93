"""Forwarding a call that holds its reservation, and settling it from the answer.

A complete answer is charged the usage it reports; an error answer from the upstream is
passed on as it is (with its retry advice) and charged nothing; an answer whose usage does
not add up is charged the whole reservation and not passed on; a connection that broke
after the request left is charged the whole reservation too (the upstream may have done
the work), one that never connected nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from holedger.gateway.call import ZERO, Call
from holedger.gateway.formats import UsageError
from holedger.gateway.metering import Metering
from holedger.gateway.routing import Poster
from holedger.gateway.upstream import UpstreamError, UpstreamResponse
from holedger.gateway.wire import JSON_TYPE, NO_RETRY, Send, send_bytes
from holedger.schemas.events import TokenUsage

RETRY_HEADERS = ("retry-after-ms", "retry-after", "x-should-retry")


def retry_headers(upstream: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The upstream's retry advice, passed on so a client's SDK backs off as told."""
    return [
        (name.encode(), str(upstream[name]).encode()) for name in RETRY_HEADERS if name in upstream
    ]


class Forwarder:
    """Forwards plain (not streamed) calls and settles every forwarded call's failures."""

    def __init__(self, metering: Metering, blob_cap: int) -> None:
        self.metering = metering
        self.blob_cap = blob_cap

    async def post(
        self, call: Call, post: Poster, forwarded: bytes, send: Send
    ) -> UpstreamResponse | None:
        """The upstream's response to ``forwarded``; None (answered and settled) when the
        upstream could not be reached."""
        call.forwarded = True
        try:
            return await post(forwarded)
        except UpstreamError as exc:
            await self.upstream_failed(call, exc, send)
            return None

    async def read(self, call: Call, resp: UpstreamResponse, send: Send) -> bytes | None:
        """The whole body of ``resp`` (then closed); None (answered and settled) when the
        connection broke first."""
        try:
            return await resp.aread()
        except UpstreamError as exc:
            await self.upstream_failed(call, exc, send)
            return None
        finally:
            await resp.aclose()

    async def forward(self, call: Call, post: Poster, forwarded: bytes, send: Send) -> None:
        resp = await self.post(call, post, forwarded, send)
        if resp is None:
            return
        data = await self.read(call, resp, send)
        if data is None:
            return
        usage: TokenUsage | None = ZERO  # a complete error answer consumed nothing
        model = None
        if resp.status_code < 400:
            try:
                obj = json.loads(data)
                usage = call.fmt.usage(obj)
                model = obj.get("model") if isinstance(obj.get("model"), str) else None
            except UsageError as exc:
                await self.bad_usage(call, str(exc), send)
                return
            except (ValueError, AttributeError):
                usage = None
        self.metering.settle(
            call,
            status=resp.status_code,
            usage=usage,
            response=data,
            model_reported=model,
            reason=None if resp.status_code < 400 else "upstream error",
        )
        headers = [
            (b"content-type", resp.headers.get("content-type", "application/json").encode()),
            call.id_header(),
            *retry_headers(resp.headers),
        ]
        await send_bytes(send, resp.status_code, data, headers)

    async def bad_usage(self, call: Call, detail: str, send: Send) -> None:
        """An answer whose usage cannot be believed: charged its whole reservation, and
        not passed on (the client gets an error in its format's shape)."""
        reason = f"upstream usage does not add up: {detail}"
        self.metering.settle(
            call, status=502, usage=None, response=b"", model_reported=None, reason=reason
        )
        body = call.fmt.error_body(502, "upstream_error", "upstream_bad_usage", reason)
        await send_bytes(send, 502, body, [JSON_TYPE, NO_RETRY, call.id_header()])

    async def upstream_failed(self, call: Call, exc: UpstreamError, send: Send) -> None:
        # The upstream may have done the work before the connection broke: charge the
        # reservation, unless the request never left (connect failure).
        reason = f"upstream unreachable: {exc.kind}"
        self.metering.settle(
            call,
            status=502,
            usage=None if exc.sent else ZERO,
            response=b"",
            model_reported=None,
            reason=reason,
        )
        body = call.fmt.error_body(502, "upstream_error", "upstream_unreachable", reason)
        await send_bytes(send, 502, body, [JSON_TYPE, NO_RETRY, call.id_header()])
