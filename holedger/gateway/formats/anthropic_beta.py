"""The ``anthropic-beta`` header: which of Anthropic's betas a call may turn on.

A beta that adds a tool Anthropic runs itself, or brings in what the request body does
not hold, reaches outside the run: it passes only when the run's terms allow the server
tool it needs (``TaskTerms.server_tools``), like the tool itself. Betas that change only
how the request is read or answered pass. A beta named in neither list is refused: a new
one may reach outside, and the operator can only allow what is known. The lists are
docs/GATEWAY.md's ("The anthropic-beta header").
"""

from __future__ import annotations

import re

from holedger.gateway.denial import Denial

# Each beta (its name without the date) that reaches outside, and the server tool in
# TaskTerms.server_tools that allows it.
OUTSIDE_BETAS = {
    "code-execution": "code_execution",
    "files-api": "files",
    "mcp-client": "mcp",
    "skills": "code_execution",
    "tool-search-tool": "tool_search",
    "web-fetch": "web_fetch",
    "web-search": "web_search",
}
# Betas that change how the request is read or answered and reach nothing outside it
# (the reservation still bounds them: the body and max_tokens are checked as ever).
HARMLESS_BETAS = frozenset(
    {
        "computer-use",
        "context-1m",
        "context-management",
        "extended-cache-ttl",
        "fine-grained-tool-streaming",
        "interleaved-thinking",
        "max-tokens-3-5-sonnet",
        "model-context-window-exceeded",
        "output-128k",
        "pdfs",
        "prompt-caching",
        "search-results",
        "structured-outputs",
        "token-counting",
        "token-efficient-tools",
    }
)
_BETA = re.compile(r"^[a-z0-9][a-z0-9.-]{0,99}$")
_DATE = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def refuse_betas(header: bytes | None, tools_allowed: frozenset[str]) -> str | None:
    """The header to pass on (None: none was sent), or a 403 ``beta_not_allowed``."""
    if header is None:
        return None
    text = header.decode("ascii", "replace")
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if not _BETA.match(name):
            raise _refused(f"anthropic-beta {name[:80]!r} is not a beta name")
        family = _DATE.sub("", name)
        if family in HARMLESS_BETAS:
            continue
        tool = OUTSIDE_BETAS.get(family)
        if tool is None:
            raise _refused(
                f"anthropic-beta {name!r} is not one the gateway knows to reach nothing "
                "outside the run; leave it out"
            )
        if tool not in tools_allowed:
            raise _refused(
                f"anthropic-beta {name!r} turns on {tool!r}, which reaches outside the "
                "run, and its terms do not allow it"
            )
    return ",".join(names) if names else None


def _refused(message: str) -> Denial:
    return Denial(403, "permission_error", "beta_not_allowed", message, param="anthropic-beta")
