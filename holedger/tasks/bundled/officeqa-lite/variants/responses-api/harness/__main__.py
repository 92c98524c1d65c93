"""officeqa-lite seed harness, written with the openai SDK's Responses API.

Reads one case as JSON on stdin ({"question": ...}), asks the target model through
POST /v1/responses at OPENAI_BASE_URL (with OPENAI_API_KEY), and prints {"answer": ...}
on stdout. The same naive starting point as the seed, lever for lever.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI

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

# --- reasoning effort
REASONING_EFFORT: str | None = None

# --- tool schema
TOOLS = [
    {
        "type": "function",
        "name": "search",
        "description": "Search.",
        "parameters": {
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
    client = OpenAI(max_retries=MAX_RETRIES, timeout=TIMEOUT_S)
    corpus = load_corpus()
    items: list[Any] = [{"role": "user", "content": str(case["question"])}]
    request: dict[str, Any] = {
        "model": MODEL,
        "instructions": SYSTEM_PROMPT + ANSWER_INSTRUCTIONS,
        "tools": TOOLS,
    }
    if REASONING_EFFORT:
        request["reasoning"] = {"effort": REASONING_EFFORT}
    for _ in range(MAX_STEPS):
        response = client.responses.create(input=items, **request)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return extract_answer(response.output_text)
        for call in calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
            arguments = json.loads(call.arguments or "{}")
            query = str(next(iter(arguments.values()), ""))
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": search(query, corpus),
                }
            )
    return ""


def main() -> None:
    case = json.load(sys.stdin)
    print(json.dumps({"answer": run(case)}))


if __name__ == "__main__":
    main()
