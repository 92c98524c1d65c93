"""officeqa-lite seed harness, written with the anthropic SDK: answers one question.

Reads one case as JSON on stdin ({"question": ...}), asks the target model through the
Anthropic Messages API at ANTHROPIC_BASE_URL (with ANTHROPIC_API_KEY), and prints
{"answer": ...} on stdout. The same naive starting point as the seed, lever for lever.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from anthropic import Anthropic

CORPUS_DIR = Path(__file__).resolve().parent.parent / "corpus"
MODEL = os.environ.get("HOLEDGER_MODEL", "holedger-sim-1")

# --- prompt
SYSTEM_PROMPT = "You are a helpful assistant."

# --- answer format
ANSWER_INSTRUCTIONS = ""

# --- step cap
MAX_STEPS = 2

# --- retry and timeout policy
MAX_RETRIES = 0
TIMEOUT_S = 30.0

# --- output limit (Messages requires one)
MAX_TOKENS = 1024

# --- tool schema
TOOLS = [
    {
        "name": "search",
        "description": "Search.",
        "input_schema": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    }
]


def load_corpus() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(CORPUS_DIR.glob("*.txt"))}


# --- retrieval policy
def search(query: str, corpus: dict[str, str]) -> str:
    """Rank documents by how many query words they contain; return the top two, clipped."""
    words = {w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2}
    ranked = sorted(corpus, key=lambda name: -sum(w in corpus[name].lower() for w in words))
    return "\n\n".join(corpus[name][:900] for name in ranked[:2])


# --- answer extraction
def extract_answer(text: str) -> str:
    """The last word of the reply, without a trailing full stop."""
    words = text.strip().split()
    return words[-1].rstrip(".") if words else ""


def run(case: dict[str, object]) -> str:
    client = Anthropic(max_retries=MAX_RETRIES, timeout=TIMEOUT_S)
    corpus = load_corpus()
    system = SYSTEM_PROMPT + ANSWER_INSTRUCTIONS
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(case["question"])}]
    for _ in range(MAX_STEPS):
        reply = client.messages.create(
            model=MODEL,
            max_tokens=MAX_TOKENS,
            system=system,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            text = "".join(block.text for block in reply.content if block.type == "text")
            return extract_answer(text)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        results = []
        for use in uses:
            query = str(next(iter(dict(use.input).values()), ""))
            results.append(
                {"type": "tool_result", "tool_use_id": use.id, "content": search(query, corpus)}
            )
        messages.append({"role": "user", "content": results})
    return ""


def main() -> None:
    case = json.load(sys.stdin)
    print(json.dumps({"answer": run(case)}))


if __name__ == "__main__":
    main()
