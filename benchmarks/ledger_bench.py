"""Ledger and replay throughput, printed side by side from one run.

    python benchmarks/ledger_bench.py [--quick] [--million N] [--pg URL | --no-pg]

Figures (events per second unless said otherwise):

1. raw Ed25519 verification with ``cryptography``, one process and ``--workers``
   processes, measured here, as the yardstick for replay;
2. signed appends through the Ledger (one event per transaction, and batched) next to
   unsigned appends through a plain eventsourcing Application on the same backend
   (SQLite file, and PostgreSQL when reachable), both with eventsourcing-sqlalchemy's own
   recorder ("stock", the target's yardstick) and with holedger's (one multi-row INSERT
   per batch, so the second ratio is signing's own cost);
3. replay verification of one run, in one process and in ``--workers`` processes (after
   one untimed replay that starts the worker processes and warms the page cache), next
   to the raw verify rate, as a ratio per core used;
4. peak RSS of a process replaying a generated run of ``--million`` events (written with
   the real signing code, rows inserted in large transactions).

Targets: replay >= 0.85 of the raw verify rate per core used; batched signed append
>= 0.5 of unsigned batched append; a 1,000,000-event replay under 300 MB peak RSS.
Figures vary with machine load; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import payload_dict, record_bytes, utc_now
from holedger.ledger.store import Ledger
from holedger.protocol.runs import origin_of
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import SCHEMA_VERSION, TaskTerms

PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SEED = bytes(range(32))
KEY_NAME = "holedger-operator"


def gateway_call(n: int) -> dict[str, Any]:
    return payload_dict(
        "GatewayCall",
        {
            "call_id": f"call-{n}",
            "scope": "target",
            "request_id": f"req-{n // 15}",
            "trial_id": f"trial-{n // 3}",
            "case_id": f"case-{n % 10}",
            "attempt": 0,
            "model_requested": "sim-small",
            "model_served": "sim-small",
            "allowed": True,
            "status": 200,
            "tokens": {"input": 812, "cached": 128, "output": 96, "reasoning": 0, "total": 908},
            "reserved": 2048,
            "latency_ms": 41,
            "request_digest": hashlib.sha256(f"req {n}".encode()).hexdigest(),
            "response_digest": hashlib.sha256(f"resp {n}".encode()).hexdigest(),
        },
    )


def budgeted_call(body: dict[str, Any], n: int) -> dict[str, Any]:
    """The n-th target call of a generated run, with the budget state the gateway would
    record: each call reserves, then settles before the next one (908 tokens each, three
    calls per trial), so every projection re-derives the same state and the run verifies."""
    total = body["tokens"]["total"]
    return dict(
        body,
        call_id=f"call-{n}",
        trial_id=f"trial-{n // 3}",
        reservation_index=n,
        budget={
            "cap": BENCH_CAP,
            "settled": n * total,
            "outstanding": 0,
            "settled_calls": n,
            "reservations": n,
            "trial_cap": None,
            "trial_settled": (n % 3) * total,
            "trial_outstanding": 0,
        },
    )


BENCH_CAP = 10**12


def terms() -> TaskTerms:
    digest = "ab" * 32
    return TaskTerms.model_validate(
        {
            "task_id": "bench",
            "models": ["sim-small"],
            "split_sizes": {"dev": 10, "val": 10, "test": 10},
            "split_digests": {"dev": digest, "val": digest, "test": digest},
            "manifest_digest": digest,
            "budget": {
                "dev": {"calls": 100, "case_passes": "4"},
                "val": {"calls": 100, "case_passes": "4"},
                "target_tokens": BENCH_CAP,
            },
            "disclosure": {},
            "k": 3,
            "resolution_band": "0.05",
            "verifier_digest": digest,
            "seed_commit": "0" * 40,
            "entrypoint": ["python", "-m", "harness"],
            "immutable_paths": [],
            "case_timeout_s": 60,
            "environment_digest": digest,
        }
    )


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- 1. crypto


def _verify_many(args: tuple[int, int]) -> float:
    count, size = args
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    public = key.public_key()
    msgs = [os.urandom(size) for _ in range(256)]
    sigs = [key.sign(m) for m in msgs]
    start = time.perf_counter()
    for i in range(count):
        public.verify(sigs[i & 255], msgs[i & 255])
    return time.perf_counter() - start


def raw_verify_rates(count: int, workers: int) -> tuple[float, float]:
    single = rate(count, _verify_many((count, 600)))
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(_verify_many, [(200, 600)] * workers))  # warm the workers up
        start = time.perf_counter()
        list(pool.map(_verify_many, [(count // workers, 600)] * workers))
        wall = time.perf_counter() - start
    return single, rate(count, wall)


# ---------------------------------------------------------------------------- 2. appends


def signed_appends(url: str, singles: int, batched: int, batch: int) -> tuple[float, float]:
    ledger = Ledger.open(url, SigningKey.from_seed(KEY_NAME, SEED), checkpoint_interval=64)
    try:
        run_id = ledger.open_run(terms(), task_digest="cd" * 32)
        calls = [gateway_call(n) for n in range(max(singles, batch))]

        def one_per_tx() -> None:
            for n in range(singles):
                ledger.append(run_id, "GatewayCall", calls[n], "gateway")

        run2 = ledger.open_run(terms(), task_digest="cd" * 32)
        items: list[tuple[str, Any, Any]] = [("GatewayCall", c, "gateway") for c in calls[:batch]]

        def batched_tx() -> None:
            for _ in range(batched // batch):
                ledger.append_many(run2, items)

        return rate(singles, timed(one_per_tx)), rate(batched, timed(batched_tx))
    finally:
        ledger.close()


class Stream(Aggregate):
    """The unsigned baseline: one eventsourcing aggregate, one event per append."""

    @event("Appended")
    def append(self, body: dict[str, Any]) -> None:
        pass


class Plain(Application[uuid.UUID]):
    name = "benchplain"


STOCK = "eventsourcing_sqlalchemy"
HOLEDGER_RECORDER = "holedger.ledger.sql:HoledgerSQLAlchemyFactory"


def unsigned_appends(
    url: str, singles: int, batched: int, batch: int, module: str = STOCK
) -> tuple[float, float]:
    app = Plain(
        env={
            "PERSISTENCE_MODULE": module,
            "SQLALCHEMY_URL": url,
            "CREATE_TABLE": "y",
            "IS_SNAPSHOTTING_ENABLED": "n",
        }
    )
    calls = [gateway_call(n) for n in range(max(singles, batch))]
    try:
        stream = Stream()
        app.save(stream)

        def one_per_tx() -> None:
            for n in range(singles):
                stream.append(calls[n])
                app.save(stream)

        other = Stream()
        app.save(other)

        def batched_tx() -> None:
            for _ in range(batched // batch):
                for body in calls[:batch]:
                    other.append(body)
                app.save(other)

        return rate(singles, timed(one_per_tx)), rate(batched, timed(batched_tx))
    finally:
        app.close()


# ---------------------------------------------------------------------------- 3, 4. replay


def _sign_chunk(signed: list[bytes]) -> list[bytes]:
    key = SigningKey.from_seed(KEY_NAME, SEED)
    return [record_bytes(s, key.sign(s)) for s in signed]


def generate_run(url: str, events: int, workers: int) -> str:
    """Write a run of ``events`` events with the real record code, signing in workers."""
    key = SigningKey.from_seed(KEY_NAME, SEED)
    ledger = Ledger.open(url, key, checkpoint_interval=64)
    run_id = ledger.open_run(terms(), task_digest="cd" * 32)  # seq 0, through the Ledger
    first = next(ledger.records(run_id))
    engine = ledger.app.engine
    rid: Any = uuid.UUID(run_id).bytes if engine.dialect.name == "sqlite" else uuid.UUID(run_id)
    frontier = MerkleFrontier()
    frontier.append(first.leaf_hash)
    prev, seq, since, calls = first.event_hash, 1, 1, 0
    body = dict(gateway_call(0), request_digest=None, response_digest=None)  # no blobs
    from sqlalchemy import text

    insert = text(
        "INSERT INTO holedger_events (originator_id, originator_version, topic, state) "
        "VALUES (:rid, :v, :t, :s)"
    )

    def envelopes(limit: int) -> Iterator[tuple[str, bytes]]:
        nonlocal prev, seq, since, calls
        for _ in range(limit):
            if seq >= events:
                return
            closing = seq == events - 2
            if since >= 64 or (seq == events - 1):
                root = frontier.root()
                note = sign_note(checkpoint_body(origin_of(run_id), seq, root), key)
                etype, payload, role = (
                    "Checkpoint",
                    {"size": seq, "root": root.hex(), "note": note},
                    "server",
                )
            elif closing:
                etype, payload, role = "RunClosed", {"reason": "completed", "summary": {}}, "server"
            else:
                etype, payload, role = "GatewayCall", budgeted_call(body, calls), "gateway"
                calls += 1
            env = {
                "run_id": run_id,
                "seq": seq,
                "type": etype,
                "schema_version": SCHEMA_VERSION,
                "time": utc_now(),
                "role": role,
                "key_id": key.key_id_hex,
                "prev_hash": prev,
                "payload": payload,
            }
            signed = canonical_json(env)
            frontier.append(hashlib.sha256(b"\x00" + signed).digest())
            prev = hashlib.sha256(signed).hexdigest()
            since = 0 if etype == "Checkpoint" else since + 1
            seq += 1
            yield etype, signed

    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        while seq < events:
            block = list(envelopes(20_000))
            parts = [block[i : i + 2_500] for i in range(0, len(block), 2_500)]
            signed_parts = pool.map(_sign_chunk, [[s for _, s in part] for part in parts])
            rows = []
            start_seq = seq - len(block)
            for part_index, raws in enumerate(signed_parts):
                for offset, raw in enumerate(raws):
                    n = start_seq + part_index * 2_500 + offset
                    rows.append({"rid": rid, "v": n + 1, "t": block[n - start_seq][0], "s": raw})
            with engine.begin() as conn:
                conn.execute(insert, rows)
    ledger.close()
    return run_id


def run_signatures(url: str, run_id: str, count: int) -> list[tuple[bytes, bytes, bytes]]:
    """(public key, signature, signed bytes) of the run's first ``count`` events."""
    from holedger.ledger.fastpath import parse_record

    ledger = Ledger.open(url, None, create_tables=False)
    try:
        records = [parse_record(raw) for _, raw in islice(ledger.raw_records(run_id), count)]
    finally:
        ledger.close()
    declared = records[0].payload["keys"].values()
    keys = {info["key_id"]: base64.b64decode(info["public_key"]) for info in declared}
    return [(keys[r.key_id], r.signature, r.signed) for r in records]


_JOBS: list[tuple[Callable[[bytes, bytes], None], bytes, bytes]] = []


def _load_signatures(triples: list[tuple[bytes, bytes, bytes]]) -> None:
    """Hold the signatures to verify in this process (once, not with every burst)."""
    keys = {raw: Ed25519PublicKey.from_public_bytes(raw) for raw, _, _ in triples}
    _JOBS[:] = [(keys[raw].verify, sig, msg) for raw, sig, msg in triples]


def _verify_run_signatures(count: int) -> float:
    """Seconds to verify ``count`` of the loaded signatures, cycling through them."""
    jobs = _JOBS
    n = len(jobs)
    start = time.perf_counter()
    for i in range(count):
        verify, sig, msg = jobs[i % n]
        verify(sig, msg)
    return time.perf_counter() - start


def replay_ratios(
    url: str, run_id: str, events: int, workers: int, rounds: int
) -> dict[int, list[tuple[float, float]]]:
    """Per process count, ``rounds`` pairs (replay events/s, raw verify/s).

    Each replay is bracketed by raw verification bursts of about its own length, in the
    same processes' worth of cores, and paired with their mean: this machine's speed
    drifts by a fifth within seconds, so only figures measured side by side compare. The
    raw bursts verify the run's own signatures (same messages, same key), so the ratio is
    replay's rate against verifying these events' signatures and nothing else.
    """
    from holedger.replay.runs import replay_run

    triples = run_signatures(url, run_id, 4096)
    ledger = Ledger.open(url, None, create_tables=False)
    pairs: dict[int, list[tuple[float, float]]] = {1: [], workers: []}
    ctx = multiprocessing.get_context("forkserver")
    _load_signatures(triples)
    try:
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_load_signatures, initargs=(triples,)
        ) as pool:

            def raw(procs: int, count: int) -> float:
                if procs == 1:
                    return rate(count, _verify_run_signatures(count))
                part = count // procs
                start = time.perf_counter()
                list(pool.map(_verify_run_signatures, [part] * procs))
                return rate(part * procs, time.perf_counter() - start)

            raw(workers, 400)  # start the pool's processes
            for procs in (1, workers):
                # Untimed: starts replay's worker processes (kept for the life of this
                # process, as they are for the holedger command's one replay) and warms
                # the database's page cache.
                replay_run(ledger, run_id, checks=(), workers=procs)
            for _ in range(rounds):
                for procs in (1, workers):
                    burst = int(pairs[procs][-1][1] * 0.4) if pairs[procs] else events // 4
                    before = raw(procs, burst)
                    start = time.perf_counter()
                    report = replay_run(ledger, run_id, checks=(), workers=procs)
                    wall = time.perf_counter() - start
                    after = raw(procs, burst)
                    if not report.verified or report.events != events:
                        raise SystemExit(f"benchmark run did not verify: {report.failures[:3]}")
                    pairs[procs].append((rate(events, wall), (before + after) / 2))
    finally:
        ledger.close()
    return pairs


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def replay_child(url: str, run_id: str, workers: int, projections: bool) -> None:
    """Entry point of the measured replay process: prints one JSON line."""
    from holedger.replay.runs import replay_run

    ledger = Ledger.open(url, None, create_tables=False)
    start = time.perf_counter()
    report = replay_run(ledger, run_id, workers=workers, checks=None if projections else ())
    wall = time.perf_counter() - start
    ledger.close()
    print(
        json.dumps(
            {
                "events": report.events,
                "verified": report.verified,
                "failed": report.failed_checks(),
                "seconds": wall,
                "rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def measure_replay_process(
    url: str, run_id: str, workers: int, projections: bool
) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", url, run_id, str(workers), str(int(projections))],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------------- main


def pg_database(url: str) -> tuple[str, Callable[[], None]] | None:
    try:
        import psycopg

        conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
        admin = psycopg.connect(conninfo, autocommit=True, connect_timeout=3)
    except Exception as exc:
        print(f"PostgreSQL at {url} unreachable ({exc}); skipping its figures")
        return None
    name = f"holedger_bench_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()

    return f"{url.rsplit('/', 1)[0]}/{name}", drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--million", type=int, default=1_000_000, help="events (0 skips)")
    parser.add_argument("--rounds", type=int, default=15, help="replay rounds per process count")
    parser.add_argument("--pg", default=PG_DEFAULT)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    quick = args.quick
    verify_n = 4_000 if quick else 20_000
    singles, batched, batch = (300, 2_000, 100) if quick else (2_000, 20_000, 100)
    replay_n = 4_000 if quick else 20_000
    rounds = 3 if quick else args.rounds
    workers = max(2, args.workers)

    print(f"holedger ledger benchmark  (cores: {os.cpu_count()}, workers: {workers})")
    print("figures vary with machine load; other processes may share these cores\n")

    raw1, rawn = raw_verify_rates(verify_n, workers)
    print("1. Ed25519 verify (cryptography), 600-byte messages")
    print(f"   1 process     {raw1:10.0f} /s")
    print(f"   {workers} processes   {rawn:10.0f} /s\n")

    with tempfile.TemporaryDirectory() as tmp:
        backends = [("SQLite", f"sqlite:///{Path(tmp) / 'bench.db'}")]
        pg = None if args.no_pg else pg_database(args.pg)
        if pg:
            backends.append(("PostgreSQL", pg[0]))
        try:
            print(
                "2. appends (events/s)      signed   unsigned: stock  holedger recorder"
                "   signed/stock  signed/holedger recorder"
            )
            for name, url in backends:
                s1, sb = signed_appends(url, singles, batched, batch)
                u1, ub = unsigned_appends(url, singles, batched, batch)
                f1, fb = unsigned_appends(url, singles, batched, batch, HOLEDGER_RECORDER)
                for label, signed, stock, fast in (
                    ("1 per tx  ", s1, u1, f1),
                    (f"{batch} per tx", sb, ub, fb),
                ):
                    print(
                        f"   {name:10s} {label} {signed:7.0f}   {stock:14.0f}  {fast:17.0f}"
                        f"   {signed / stock:12.2f}  {signed / fast:24.2f}"
                    )
            print()

            url = backends[0][1]
            run_id = generate_run(url, replay_n, workers)
            pairs = replay_ratios(url, run_id, replay_n, workers, rounds)
            print(
                f"3. replay verification of a {replay_n}-event run (SQLite, integrity checks),"
                f" {rounds} rounds;\n   raw = the run's own signatures verified alone, "
                "measured just before and after each replay in as many processes"
            )
            print(
                "                    replay/s   raw verify/s   ratio: median   min    max"
                "   (target >= 0.85)"
            )
            for procs, label in ((1, "1 process  "), (workers, f"{workers} processes")):
                ratios = [r / v for r, v in pairs[procs]]
                print(
                    f"   {label}  {median([r for r, _ in pairs[procs]]):10.0f}"
                    f"   {median([v for _, v in pairs[procs]]):12.0f}"
                    f"   {median(ratios):13.2f}  {min(ratios):5.2f}  {max(ratios):5.2f}"
                )
            print()

            if args.million:
                n = args.million
                start = time.perf_counter()
                big = generate_run(url, n, workers)
                made = time.perf_counter() - start
                print(f"4. a generated {n}-event run (written in {made:.0f} s)")
                for label, w, proj in (
                    ("integrity checks, 1 process", 1, False),
                    (f"all projections, {workers} processes", workers, True),
                ):
                    res = measure_replay_process(url, big, w, proj)
                    speed = res["events"] / res["seconds"]
                    print(
                        f"   {label:32s} {speed:8.0f} ev/s   peak RSS {res['rss_self_mb']:6.1f} MB"
                        f"   verified={res['verified']} {res['failed'] or ''}"
                    )
        finally:
            if pg:
                pg[1]()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        replay_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
    else:
        main()
