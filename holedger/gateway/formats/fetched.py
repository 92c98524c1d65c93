"""Content the upstream would fetch itself: a media or file part named by a URL or by a
file id instead of carried in the body.

An image, document or file given by URL (Anthropic's ``source`` of type ``url``, Chat
Completions' ``image_url.url``, Responses' ``image_url`` and ``file_url``) makes the
provider fetch it from outside the run: a web fetch the harness asked for, whose URL can
carry what the harness knows out. A part given by ``file_id`` brings in a file stored
with the provider, which the body does not hold. Each passes only when the run's terms
allow the server tool it needs (``web_fetch``, ``files``), like the tool itself; a part
whose data is in the body (base64, a ``data:`` URL) passes as ever.
"""

from __future__ import annotations

from typing import Any

from holedger.gateway.denial import Denial

# The request fields that carry a conversation's content, in every format.
CONTENT_FIELDS = ("messages", "input", "system")


def _fetched(part: dict[str, Any]) -> str | None:
    """The server tool a content part needs, or None."""
    if isinstance(part.get("file_id"), str):
        return "files"
    if part.get("type") == "url" and isinstance(part.get("url"), str):
        return "web_fetch"
    for key in ("image_url", "file_url"):
        value = part.get(key)
        url = value.get("url") if isinstance(value, dict) else value
        if isinstance(url, str) and not url.strip().lower().startswith("data:"):
            return "web_fetch"
    return None


def refuse_fetched(body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
    """403 ``tool_not_allowed`` for a content part the upstream would fetch, unless the
    terms allow what it needs."""
    stack: list[Any] = [body.get(field) for field in CONTENT_FIELDS]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            tool = _fetched(value)
            if tool is not None and tool not in tools_allowed:
                raise Denial(
                    403,
                    "permission_error",
                    "tool_not_allowed",
                    f"a content part the upstream would fetch itself needs {tool!r}, which "
                    "reaches outside the run, and its terms do not allow it; put the data in "
                    "the request (base64)",
                    param="messages",
                )
            stack.extend(v for v in value.values() if isinstance(v, list | dict))
