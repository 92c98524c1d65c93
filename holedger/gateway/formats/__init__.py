"""The wire formats the gateway serves, one module each, by the path they are served on.

Adding a format: name its path in :mod:`holedger.protocol.endpoints` (and whether it is
metered), subclass :class:`~holedger.gateway.formats.base.WireFormat` (parse, rewrite,
usage, error shape, stream pump) and list it in ``FORMATS``; the gateway's checks, budget
and recording, and replay's, apply to it unchanged.
"""

from __future__ import annotations

from holedger.gateway.formats.anthropic import CountTokensFormat, MessagesFormat
from holedger.gateway.formats.base import Limits, Rewritten, SsePump, UsageError, WireFormat
from holedger.gateway.formats.chat import ChatFormat
from holedger.gateway.formats.embeddings import EmbeddingsFormat
from holedger.gateway.formats.responses import ResponsesFormat

CHAT = ChatFormat()
FORMATS: dict[str, WireFormat] = {
    fmt.path: fmt
    for fmt in (CHAT, ResponsesFormat(), EmbeddingsFormat(), MessagesFormat(), CountTokensFormat())
}


def format_for_path(path: str) -> WireFormat | None:
    return FORMATS.get(path)


__all__ = [
    "CHAT",
    "FORMATS",
    "Limits",
    "Rewritten",
    "SsePump",
    "UsageError",
    "WireFormat",
    "format_for_path",
]
