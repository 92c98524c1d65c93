"""OpenAI embeddings: ``POST /v1/embeddings`` (never streamed).

Reservation: the prompt bound alone (an embedding has no output tokens). Usage:
``prompt_tokens`` and ``total_tokens``, which must be equal. Token-id inputs are bounded
too: each id takes at least one byte of the body.
"""

from __future__ import annotations

from typing import Any

from holedger.gateway.denial import invalid
from holedger.gateway.formats import base
from holedger.gateway.formats.base import Limits, Rewritten, SsePump, WireFormat
from holedger.gateway.formats.chat import openai_usage
from holedger.gateway.limits import Bound
from holedger.protocol import endpoints
from holedger.schemas.events import TokenUsage


class EmbeddingsFormat(WireFormat):
    """Embeddings: input only, never streamed."""

    name = "embeddings"
    path = endpoints.EMBEDDINGS
    providers = base.OPENAI_PROVIDERS
    limit_field = "input"
    stream_field = None

    def check(self, body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
        value = body.get("input")
        if not isinstance(value, str | list) or (isinstance(value, list) and not value):
            raise invalid("'input' must be text or a non-empty list", "input")
        base.within_bounds(body, (Bound("dimensions", 1, 65536),))
        if body.get("stream"):
            raise invalid("embeddings are not streamed", "stream")

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        return Rewritten(base.dump({**body, "model": model}), None, 0)

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        return openai_usage(answer.get("usage"))

    def pump(self, body: dict[str, Any], cap: int) -> SsePump:
        raise NotImplementedError("embeddings are not streamed")
