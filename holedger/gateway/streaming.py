"""Forwarding a streamed call: the upstream's SSE events pass through the format's pump,
which reads the usage on the way, and the call is settled once.

It is settled before the last byte goes out (once the client has its answer, its trial
may end and read its totals). A stream that ends without usage, a client that leaves
mid-stream, or a stream the pump breaks off (an unknown event type, usage that does not
add up) is charged its whole reservation; an error answer before the stream began is
passed on and charged nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from holedger.gateway.call import ZERO, Call
from holedger.gateway.forwarding import Forwarder, retry_headers
from holedger.gateway.routing import Poster
from holedger.gateway.upstream import UpstreamError
from holedger.gateway.wire import JSON_TYPE, SSE_TYPE, Message, Receive, Send, send_bytes


async def forward_stream(
    fwd: Forwarder,
    call: Call,
    post: Poster,
    forwarded: bytes,
    body: dict[str, Any],
    receive: Receive,
    send: Send,
) -> None:
    resp = await fwd.post(call, post, forwarded, send)
    if resp is None:
        return
    if resp.status_code >= 400:
        data = await fwd.read(call, resp, send)
        if data is None:
            return
        fwd.metering.settle(
            call,
            status=resp.status_code,
            usage=ZERO,
            response=data,
            model_reported=None,
            reason="upstream error",
        )
        headers = [JSON_TYPE, call.id_header(), *retry_headers(resp.headers)]
        await send_bytes(send, resp.status_code, data, headers)
        return
    pump = call.fmt.pump(body, fwd.blob_cap)
    finished = False
    client_gone = False
    settled = False

    def settle_once() -> None:
        nonlocal settled
        if settled:
            return
        settled = True
        reason = None
        if pump.usage is None:
            if client_gone:
                reason = "client disconnected before the usage chunk"
            elif pump.cut is not None:
                reason = pump.cut
            else:
                reason = "upstream sent no usage chunk"
        fwd.metering.settle(
            call,
            status=200,
            usage=pump.usage,
            response=pump.sent,
            model_reported=pump.model,
            reason=reason,
        )

    task = asyncio.current_task()
    assert task is not None

    async def watch() -> None:
        # The client leaving mid-stream stops the forwarding (it is charged below).
        nonlocal client_gone
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                if not finished:
                    client_gone = True
                    task.cancel()
                return

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [SSE_TYPE, (b"cache-control", b"no-cache"), call.id_header()],
            }
        )
        call.responded = True
        try:
            async for chunk in resp.aiter_raw():
                out = pump.feed(chunk)
                if pump.done or pump.broken:
                    settle_once()  # a client stops reading at its stream's last event
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if pump.broken:
                    break
            tail = pump.finish()
            if pump.broken:
                tail += pump.error_event(pump.broken, "upstream_bad_stream")
        except UpstreamError as exc:
            pump.cut = f"upstream stream broke: {exc.kind}"
            tail = pump.finish() + pump.error_event(pump.cut)
        finished = True
        settle_once()
        await send({"type": "http.response.body", "body": tail, "more_body": False})
    except asyncio.CancelledError:
        if not client_gone:
            raise
        task.uncancel()  # our own cancellation: the client left
    except Exception as exc:
        pump.cut = pump.cut or f"gateway error: {type(exc).__name__}"  # settled below
        raise
    finally:
        watcher.cancel()
        await resp.aclose()
        settle_once()
