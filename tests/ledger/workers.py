"""Writer processes for the crash and concurrency tests (run in forked children).

Each writer opens its own Ledger (never a parent's connection) with create_tables off,
as a writer should once ``holedger init`` has created the schema.
"""

from __future__ import annotations

from typing import Any

from holedger.errors import LedgerConflictError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger

KEY_NAME = "holedger-operator"


def gateway_call(call_id: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "scope": "target",
        "model_requested": "sim-small",
        "model_served": "sim-small",
        "allowed": True,
        "status": 200,
        "tokens": {"input": 10, "cached": 0, "output": 5, "reasoning": 0, "total": 15},
        "reserved": 100,
        "latency_ms": 3,
        "request_digest": None,
        "response_digest": None,
    }


def open_writer(url: str, seed: bytes, checkpoint_interval: int = 16) -> Ledger:
    key = SigningKey.from_seed(KEY_NAME, seed)
    return Ledger.open(url, key, checkpoint_interval=checkpoint_interval, create_tables=False)


def append_batches_forever(
    url: str, seed: bytes, run_id: str, first_batch: int, started: Any = None
) -> None:
    """Append batches of 1 to 4 events, each call id naming its batch, until killed.

    ``started`` (an Event) is set once the first batch is committed.
    """
    ledger = open_writer(url, seed)
    batch = first_batch
    while True:
        size = 1 + batch % 4
        items = [
            ("GatewayCall", gateway_call(f"b{batch}-{i}-of-{size}"), "gateway") for i in range(size)
        ]
        ledger.append_many(run_id, items)  # type: ignore[arg-type]
        if started is not None and batch == first_batch:
            started.set()
        batch += 1


def append_n(url: str, seed: bytes, run_id: str, tag: str, count: int) -> None:
    """Append ``count`` single-event transactions to ``run_id``, retrying on conflict."""
    ledger = open_writer(url, seed)
    conflicts = 0
    for index in range(count):
        while True:
            try:
                ledger.append(run_id, "GatewayCall", gateway_call(f"{tag}-{index}"), "gateway")
                break
            except LedgerConflictError:
                conflicts += 1  # someone else wrote first: re-read (the head) and retry
    ledger.close()
    print(f"{tag}: {count} appended, {conflicts} conflicts retried", flush=True)
