"""The model endpoints the gateway serves, by path, and which of them are metered: the
gateway serves a wire format on each (``gateway/formats/``), and replay checks that every
allowed call of a metered one held a reservation and that the allow-list decided every one.
"""

from __future__ import annotations

CHAT_COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
MESSAGES = "/v1/messages"
# Metered: it reserves its prompt's bound and settles at 0 tokens.
COUNT_TOKENS = "/v1/messages/count_tokens"

# Every endpoint and whether its calls hold a reservation (False: answers cost no tokens).
METERED: dict[str, bool] = {
    CHAT_COMPLETIONS: True,
    RESPONSES: True,
    EMBEDDINGS: True,
    MESSAGES: True,
    COUNT_TOKENS: True,
}
MODEL_PATHS = frozenset(METERED)
METERED_PATHS = frozenset(path for path, metered in METERED.items() if metered)
