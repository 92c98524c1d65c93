"""Latency the gateway adds over calling the same upstream directly; LiteLLM alongside.

Three processes are started: the offline simulator as the upstream (``holedger sim serve``),
the holedger gateway in front of it (its own process, SQLite ledger in a temp dir), and,
when the ``litellm`` command is available (on PATH or at $LITELLM_BIN), LiteLLM's proxy in
front of the same upstream. The client sends the same chat completions to each, in
interleaved rounds, at each concurrency level, and prints p50/p99 latency, requests per
second, the latency each proxy adds over the direct call, and the ratio of the two.

    python benchmarks/gateway_bench.py [--requests 600] [--concurrency 1,32] [--stream]

Figures depend on the machine; nothing here asserts a time. Targets: at most 2 ms p50 and
10 ms p99 added by the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "holedger-sim-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout} s")


@contextlib.contextmanager
def process(args: list[str], log: Path, **kw: object) -> Iterator[subprocess.Popen[bytes]]:
    """A child process whose output goes to ``log`` (a pipe nobody reads would block it)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(  # type: ignore[call-overload]
            args, stdout=out, stderr=subprocess.STDOUT, **kw
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------------------- gateway


def serve_gateway_process(ledger_url: str, upstream: str, port: int) -> None:
    """The gateway process: the ledger and its run exist already (made by the parent)."""
    from holedger.gateway.app import create_gateway_app
    from holedger.gateway.config import GatewayConfig, UpstreamConfig
    from holedger.gateway.serve import AppServer
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger

    ledger = Ledger.open(ledger_url, SigningKey.generate("holedger-bench"))
    config = GatewayConfig(upstream=UpstreamConfig(base_url=upstream))
    AppServer(create_gateway_app(ledger, None, config), port=port).run()


def prepare_ledger(url: str) -> str:
    """A run with a budget large enough for the benchmark, and one trial's token."""
    import hashlib

    from holedger.gateway.tokens import TokenRegistry
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger
    from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget, TaskTerms

    def h(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    terms = TaskTerms(
        task_id="gateway-bench",
        models=[MODEL],
        split_sizes={"dev": 1, "val": 1, "test": 1},
        split_digests={s: h(s) for s in ("dev", "val", "test")},
        manifest_digest=h("m"),
        budget=BudgetVector(
            dev=SplitBudget(calls=1, case_passes="1"),
            val=SplitBudget(calls=1, case_passes="1"),
            target_tokens=10**12,
        ),
        disclosure=DisclosurePolicy(),
        k=1,
        resolution_band="0",
        verifier_digest=h("v"),
        seed_commit="0" * 40,
        entrypoint=["python", "-m", "harness"],
        immutable_paths=[],
        case_timeout_s=60,
        environment_digest=h("e"),
    )
    ledger = Ledger.open(url, SigningKey.generate("holedger-bench"))
    run_id = ledger.open_run(terms, task_digest=h("task"))
    token = TokenRegistry(ledger.app.engine).issue_trial_token(
        run_id, request_id="bench", trial_id="bench", case_id="bench", attempt=0, ttl_s=None
    )
    ledger.close()
    return token


# ---------------------------------------------------------------------------- litellm


def litellm_command() -> str | None:
    return os.environ.get("LITELLM_BIN") or shutil.which("litellm")


def litellm_config(path: Path, upstream: str) -> None:
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}\n"
        "      api_key: unused\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )


# ---------------------------------------------------------------------------- load


@dataclass
class Sample:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0
    count: int = 0
    cpu_s: float = 0.0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes and their children so far (Linux /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / tick
    return total


async def load(
    client: httpx.AsyncClient, url: str, key: str, n: int, concurrency: int, stream: bool
) -> Sample:
    sample = Sample()
    counter = iter(range(n))
    headers = {"authorization": f"Bearer {key}"}

    async def worker() -> None:
        for i in counter:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Request {i}: what is Acme's revenue?"}],
                "max_tokens": 64,
                "stream": stream,
            }
            t0 = time.perf_counter()
            if stream:
                async with client.stream("POST", url, json=body, headers=headers) as resp:
                    async for _ in resp.aiter_raw():
                        pass
                    status = resp.status_code
            else:
                resp = await client.post(url, json=body, headers=headers)
                status = resp.status_code
            dt = time.perf_counter() - t0
            if status == 200:
                sample.latencies.append(dt)
            else:
                sample.errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    sample.elapsed = time.perf_counter() - t0
    sample.count = n
    return sample


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench(
    targets: dict[str, tuple[str, str]],
    requests: int,
    levels: list[int],
    stream: bool,
    rounds: int,
    pids: dict[str, list[int]],
) -> dict[int, dict[str, Sample]]:
    results: dict[int, dict[str, Sample]] = {}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for url, key in targets.values():  # warm up every path
            await load(client, url, key, 40, 4, stream)
        for level in levels:
            merged = {name: Sample() for name in targets}
            per_round = max(level, requests // rounds)
            for _ in range(rounds):
                for name, (url, key) in targets.items():
                    before = cpu_seconds(pids.get(name, []))
                    s = await load(client, url, key, per_round, level, stream)
                    m = merged[name]
                    m.cpu_s += cpu_seconds(pids.get(name, [])) - before
                    m.latencies += s.latencies
                    m.errors += s.errors
                    m.elapsed += s.elapsed
                    m.count += s.count
            results[level] = merged
    return results


def report(results: dict[int, dict[str, Sample]], stream: bool) -> None:
    mode = "streaming" if stream else "non-streaming"
    print(f"\nchat completions, {mode}; latency in ms (200 answers only)\n")
    head = f"{'clients':>7}  {'path':<10} {'p50':>8} {'p99':>8} {'req/s':>8} {'errors':>6}"
    head += f"  {'+p50':>7} {'+p99':>7}  {'proxy cpu ms/req':>16}"
    print(head)
    for level, samples in results.items():
        direct = samples["direct"]
        d50, d99 = pct(direct.latencies, 0.5), pct(direct.latencies, 0.99)
        added: dict[str, tuple[float, float]] = {}
        for name, s in samples.items():
            p50, p99 = pct(s.latencies, 0.5), pct(s.latencies, 0.99)
            rps = s.count / s.elapsed if s.elapsed else float("nan")
            line = f"{level:>7}  {name:<10} {p50:8.2f} {p99:8.2f} {rps:8.0f} {s.errors:>6}"
            if name != "direct":
                added[name] = (p50 - d50, p99 - d99)
                line += f"  {p50 - d50:7.2f} {p99 - d99:7.2f}"
                line += f"  {s.cpu_s / max(s.count, 1) * 1000:16.2f}"
            print(line)
        if "gateway" in added and "litellm" in added:
            g50, g99 = added["gateway"]
            l50, l99 = added["litellm"]
            print(
                f"{'':>7}  added latency, gateway / litellm: p50 {_ratio(g50, l50)}, "
                f"p99 {_ratio(g99, l99)}"
            )
        if "gateway" in added:
            g50, g99 = added["gateway"]
            verdict = "within" if g50 <= 2 and g99 <= 10 else "over"
            print(f"{'':>7}  gateway added p50 {g50:.2f} ms, p99 {g99:.2f} ms: {verdict} 2/10 ms")


def _ratio(a: float, b: float) -> str:
    if b <= 0:
        return "n/a (litellm added nothing measurable)"
    return f"{a / b:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="per path and level")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--serve-gateway", nargs=3, metavar=("LEDGER", "UPSTREAM", "PORT"))
    args = parser.parse_args()
    if args.serve_gateway:
        ledger_url, upstream, port = args.serve_gateway
        serve_gateway_process(ledger_url, upstream, int(port))
        return
    levels = [int(x) for x in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="holedger-bench-"))
    ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
    token = prepare_ledger(ledger_url)
    up_port, gw_port, ll_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    sim = [sys.executable, "-m", "holedger.cli", "sim", "serve", "--port", str(up_port)]
    gw = [sys.executable, __file__, "--serve-gateway", ledger_url, upstream, str(gw_port)]
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(process(sim, tmp / "sim.log"))
        wait_ready(f"{upstream}/models", up)
        gp = stack.enter_context(process(gw, tmp / "gateway.log"))
        wait_ready(f"http://127.0.0.1:{gw_port}/v1/models", gp)
        targets = {
            "direct": (f"{upstream}/chat/completions", "unused"),
            "gateway": (f"http://127.0.0.1:{gw_port}/v1/chat/completions", token),
        }
        command = None if args.no_litellm else litellm_command()
        if command is None:
            print(
                "litellm: not measured ("
                + ("--no-litellm" if args.no_litellm else "no 'litellm' command; set LITELLM_BIN")
                + ")"
            )
        else:
            cfg = tmp / "litellm.yaml"
            litellm_config(cfg, upstream)
            ll_args = [command, "--config", str(cfg), "--port", str(ll_port), "--num_workers", "1"]
            master = "sk-" + secrets.token_hex(32)
            env = dict(
                os.environ,
                LITELLM_LOG="ERROR",
                LITELLM_TELEMETRY="False",
                LITELLM_MASTER_KEY=master,
            )
            lp = stack.enter_context(process(ll_args, tmp / "litellm.log", env=env))
            try:
                wait_ready(f"http://127.0.0.1:{ll_port}/health/liveliness", lp, timeout=180)
                targets["litellm"] = (f"http://127.0.0.1:{ll_port}/v1/chat/completions", master)
            except RuntimeError as exc:
                err = (
                    lp.stderr.read().decode()[-400:] if lp.stderr and lp.poll() is not None else ""
                )
                print(f"litellm: not measured ({exc}) {err}")
        pids = {"gateway": [gp.pid]}
        if "litellm" in targets:
            pids["litellm"] = [lp.pid]
        results = asyncio.run(bench(targets, args.requests, levels, args.stream, args.rounds, pids))
    report(results, args.stream)
    shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()[0]
    print(f"\nload average during the run: {load1:.1f} on {os.cpu_count()} CPUs", end="")
    print(" (a loaded machine inflates every added latency)" if load1 > 1 else "")


if __name__ == "__main__":
    main()
