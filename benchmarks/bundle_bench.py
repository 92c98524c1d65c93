"""Bundle throughput: export and verify rates and bundle size, next to replay's rate.

Records one run of about N events (candidate commits, gateway calls and safety events
with blobs) into a fresh SQLite ledger (or --ledger URL), then times, on the same run:

* ``replay``  the ledger's own replay (database -> report),
* ``export``  database -> bundle file,
* ``verify``  bundle file -> the same report,
* ``verify (redacted)`` on a bundle exported with --redact,

and prints events per second, bytes per event and the ratios to replay. Nothing is
asserted: run it, read the figures.

    python benchmarks/bundle_bench.py [--events 5000] [--repeat 3] [--ledger URL]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from holedger.bundles.export import export_bundle
from holedger.bundles.verify import verify_bundle
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.schemas.events import (
    BudgetVector,
    CandidateCommitted,
    DisclosurePolicy,
    GatewayCall,
    SafetyViolation,
    SplitBudget,
    TaskTerms,
    TokenUsage,
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def terms() -> TaskTerms:
    return TaskTerms(
        task_id="bench",
        models=["sim-small"],
        split_sizes={"dev": 10, "val": 10, "test": 10},
        split_digests={"dev": sha("dev"), "val": sha("val"), "test": sha("test")},
        manifest_digest=sha("manifest"),
        budget=BudgetVector(
            dev=SplitBudget(calls=100, case_passes=Fraction(4)),
            val=SplitBudget(calls=100, case_passes=Fraction(4)),
            target_tokens=10**12,
        ),
        disclosure=DisclosurePolicy(),
        k=3,
        resolution_band=Fraction(1, 20),
        verifier_digest=sha("verifier"),
        seed_commit="0" * 40,
        entrypoint=["python", "-m", "harness"],
        immutable_paths=["verifier/"],
        case_timeout_s=60,
        environment_digest=sha("env"),
    )


def record(ledger: Ledger, events: int) -> str:
    run_id = ledger.open_run(terms(), task_digest=sha("bench"), optimizer="bench")
    batch: list[tuple[str, object, str]] = []
    for i in range(events):
        if i % 50 == 0:
            commit = hashlib.sha1(f"c{i}".encode()).hexdigest()
            payload: object = CandidateCommitted(
                candidate=commit,
                index=i // 50,
                tree=hashlib.sha1(f"t{i}".encode()).hexdigest(),
                parent=None,
                changed_paths=["harness/agent.py"],
                immutable_ok=True,
            )
            batch.append(("CandidateCommitted", payload, "server"))
        elif i % 2:
            request = ledger.put_blob(b'{"messages": [%d]}' % i + b" " * 400)
            response = ledger.put_blob(b'{"choices": [%d]}' % i + b" " * 800)
            payload = GatewayCall(
                call_id=f"call-{i}",
                scope="optimizer",
                model_requested="sim-small",
                model_served="sim-small",
                allowed=True,
                status=200,
                tokens=TokenUsage(input=100, cached=0, output=20, reasoning=0, total=120),
                reserved=0,
                latency_ms=5,
                request_digest=request,
                response_digest=response,
            )
            batch.append(("GatewayCall", payload, "gateway"))
        else:
            evidence = ledger.put_blob(f"evidence {i}".encode() * 20)
            payload = SafetyViolation(
                category="timeout", trial_id=f"t{i}", detail="slow", evidence_digest=evidence
            )
            batch.append(("SafetyViolation", payload, "sandbox"))
        if len(batch) == 200:
            ledger.append_many(run_id, batch)  # type: ignore[arg-type]
            batch = []
    if batch:
        ledger.append_many(run_id, batch)  # type: ignore[arg-type]
    ledger.close_run(run_id)
    return run_id


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ledger", help="ledger URL (default: SQLite in a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.resolve(Path(tmp) / "home", args.ledger)
        settings.home.mkdir(parents=True)
        ledger = Ledger.open(settings.ledger_url, SigningKey.generate("bench-operator"))
        try:
            run_id = record(ledger, args.events)
            n = sum(1 for _ in ledger.raw_records(run_id))
            full, red = Path(tmp) / "run.hlb", Path(tmp) / "redacted.hlb"
            t_replay = best_of(args.repeat, lambda: replay_run(ledger, run_id))
            t_export = best_of(args.repeat, lambda: export_bundle(ledger, run_id, full))
            t_export_red = best_of(
                args.repeat, lambda: export_bundle(ledger, run_id, red, redact=True)
            )
            t_verify = best_of(args.repeat, lambda: verify_bundle(full))
            t_verify_red = best_of(args.repeat, lambda: verify_bundle(red))
            assert verify_bundle(full).verified == replay_run(ledger, run_id).verified
            record_bytes = sum(len(raw) for _, raw in ledger.raw_records(run_id))
        finally:
            ledger.close()
        size_full, size_red = full.stat().st_size, red.stat().st_size
    print(f"run of {n} events ({settings.ledger_url.split(':')[0]}), best of {args.repeat}")
    print(f"{'step':<22}{'seconds':>10}{'events/s':>12}{'vs replay':>11}")
    for name, t in (
        ("replay (database)", t_replay),
        ("export", t_export),
        ("export --redact", t_export_red),
        ("verify (bundle)", t_verify),
        ("verify (redacted)", t_verify_red),
    ):
        print(f"{name:<22}{t:>10.3f}{n / t:>12.0f}{t_replay / t:>10.2f}x")
    print(f"{'bundle':<22}{'bytes':>10}{'bytes/event':>12}")
    print(f"{'records alone':<22}{record_bytes:>10}{record_bytes / n:>12.0f}")
    print(f"{'full bundle':<22}{size_full:>10}{size_full / n:>12.0f}")
    print(f"{'redacted bundle':<22}{size_red:>10}{size_red / n:>12.0f}")


if __name__ == "__main__":
    main()
