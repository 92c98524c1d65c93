"""Latency the gateway adds over calling the same upstream directly; LiteLLM alongside.

For each level, processes are started: the offline simulator as the upstream
(``holedger sim serve``), the holedger gateway in front of it (its own process, SQLite
ledger in a temp dir), the floor (a bare pass-through proxy on the gateway's own server
stack: uvicorn, raw ASGI, the same upstream client; it checks and records nothing), and,
when the ``litellm`` command is available (on PATH or at $LITELLM_BIN), LiteLLM's proxy
in front of the same upstream. One client (a keep-alive HTTP/1.1 client, the same for
every path) sends the same chat completions to each path, in interleaved rounds, and
prints per path: p50/p99 latency, requests per second, errors (the simulator answers
about 4% of calls with a transient error, on every path alike), the latency the proxy
adds over the direct call (difference of the p50s and of the p99s), and the CPU time
spent per request by the proxy process (and, for the gateway, by its event writer thread
alone: building, signing and storing the GatewayCall events), by the upstream and by the
client, with how busy the whole machine was. What the floor adds is what any gateway on
this stack adds on this machine; the gateway's own work is what it adds beyond that.

    python benchmarks/gateway_bench.py [--requests 1500] [--levels 1,32@200,32] [--stream]
        [--formats chat,responses,messages,embeddings]

``--formats`` measures each wire format in turn, beside chat completions: the same
question as a Responses request (``/v1/responses``), an Anthropic Messages request
(``/v1/messages``, sent with ``x-api-key``) or an embeddings request of 8 texts
(``/v1/embeddings``, never streamed), each on the direct path, the floor and the gateway
(LiteLLM is measured for chat completions only).

A level is ``CLIENTS[@MS]``: that many concurrent clients, against an upstream that
answers after MS milliseconds (0 when omitted). ``32@200`` stands for 32 trials waiting on
a model: the machine stays below saturation, so the difference is the gateway's own
latency. ``32`` (an instant upstream) saturates a small machine: client, upstream and
gateway queue for the same cores, and each request the gateway handles delays the others;
there the added latency mostly measures CPU cost, so read requests per second and CPU per
request instead.

Figures depend on the machine and on what else runs on it; nothing here asserts a time.
Targets: at most 2 ms p50 and 10 ms p99 added by the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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
PATHS = {
    "chat": "/chat/completions",
    "responses": "/responses",
    "messages": "/messages",
    "embeddings": "/embeddings",
}


def request_body(fmt: str, i: int, stream: bool) -> dict[str, object]:
    """Call ``i`` of the load in wire format ``fmt`` (the same question in each)."""
    question = f"Request {i}: what is Acme's revenue?"
    if fmt == "responses":
        return {"model": MODEL, "input": question, "max_output_tokens": 64, "stream": stream}
    if fmt == "messages":
        return {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": question}],
            "stream": stream,
        }
    if fmt == "embeddings":
        return {"model": MODEL, "input": [f"{question} ({k})" for k in range(8)]}
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 64,
        "stream": stream,
    }


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


def serve_gateway_process(ledger_url: str, upstream: str, port: int, info: str = "") -> None:
    """The gateway process: the ledger and its run exist already (made by the parent).
    ``info``, when given, is a file that receives the writer thread's id and the URL that
    drains the writer (a small control server beside it, for the benchmark only)."""
    import http.server
    import threading

    from holedger.gateway.app import create_gateway_app
    from holedger.gateway.config import GatewayConfig, UpstreamConfig
    from holedger.gateway.serve import AppServer
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger

    ledger = Ledger.open(ledger_url, SigningKey.generate("holedger-bench"))
    # The simulator speaks every wire format.
    config = GatewayConfig(upstream=UpstreamConfig(base_url=upstream, provider="simulator"))
    app = create_gateway_app(ledger, None, config)

    class Drain(http.server.BaseHTTPRequestHandler):
        """POST: wait until the event writer has written every event so far."""

        def do_POST(self) -> None:
            backlog = app.writer.backlog
            done = app.flush(120.0)
            body = json.dumps({"backlog": backlog, "flushed": done}).encode()
            self.send_response(200 if done else 504)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    control = http.server.HTTPServer(("127.0.0.1", 0), Drain)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    if info:
        drain = f"http://127.0.0.1:{control.server_address[1]}/drain"
        Path(info).write_text(json.dumps({"writer_tid": app.writer.thread_id, "drain": drain}))
    AppServer(app, port=port).run()


def serve_floor_process(upstream: str, port: int) -> None:
    """The floor: a bare pass-through proxy on the gateway's own server stack (uvicorn,
    raw ASGI, the same upstream client), with no token, allow-list, budget or event. What
    it adds over the direct path is what any gateway built on this stack adds on this
    machine; the gateway's own work is the difference between the two."""
    import gc

    from holedger.gateway.serve import AppServer
    from holedger.gateway.upstream import HttpUpstream
    from holedger.gateway.wire import JSON_TYPE, Receive, Scope, Send, send_bytes

    http = HttpUpstream(upstream, [("content-type", "application/json")], timeout_s=60)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":  # readiness
            await send_bytes(send, 200, b'{"object":"list","data":[]}', [JSON_TYPE])
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        resp = await http.post(b"".join(chunks), scope["path"].removeprefix("/v1"))
        try:
            data = await resp.aread()
        finally:
            await resp.aclose()
        ctype = resp.headers.get("content-type", "application/json").encode()
        await send_bytes(send, resp.status_code, data, [(b"content-type", ctype)])

    gc.freeze()  # as the gateway does once it starts
    AppServer(app, port=port).run()


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


# ---------------------------------------------------------------------------- CPU


def _ticks(stat: str) -> int:
    """utime + stime of one /proc stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of a process, or of one of its threads (Linux /proc)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        return _ticks(Path(path).read_text()) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far."""
    try:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@dataclass
class Meters:
    """Who is measured: the proxy's process (and the gateway's writer thread), the
    upstream's process, and this client."""

    proxy: int | None = None
    writer: int | None = None
    upstream: int | None = None
    drain: str | None = None  # the gateway's: waits until its events are written

    def read(self) -> tuple[float, float, float, float, tuple[int, int]]:
        return (
            cpu_seconds(self.proxy) if self.proxy else 0.0,
            cpu_seconds(self.proxy, self.writer) if self.proxy and self.writer else 0.0,
            cpu_seconds(self.upstream) if self.upstream else 0.0,
            time.process_time(),
            machine_ticks(),
        )


# ---------------------------------------------------------------------------- load


@dataclass
class Sample:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0
    count: int = 0
    proxy_cpu: float = 0.0
    writer_cpu: float = 0.0
    upstream_cpu: float = 0.0
    client_cpu: float = 0.0
    busy: int = 0
    ticks: int = 0
    drain_s: float = 0.0
    backlog: int = 0

    def add(self, other: Sample) -> None:
        self.latencies += other.latencies
        for name in (
            "errors",
            "elapsed",
            "count",
            "proxy_cpu",
            "writer_cpu",
            "upstream_cpu",
            "client_cpu",
            "busy",
            "ticks",
            "drain_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.backlog = max(self.backlog, other.backlog)


class Client:
    """A keep-alive HTTP/1.1 client for one path (the gateway's own upstream client: one
    write per request, no per-request objects beyond the answer)."""

    def __init__(self, url: str, key: str, fmt: str = "chat") -> None:
        from holedger.gateway.upstream import HttpUpstream

        self.path = PATHS[fmt]
        base = url.removesuffix(self.path)
        auth = ("x-api-key", key) if fmt == "messages" else ("authorization", f"Bearer {key}")
        headers = [("content-type", "application/json"), auth]
        self.http = HttpUpstream(base, headers, timeout_s=60, max_idle=512)
        self.fmt = fmt

    async def call(self, body: bytes, stream: bool) -> int:
        resp = await self.http.post(body, self.path)
        try:
            if stream:
                async for _ in resp.aiter_raw():
                    pass
            else:
                await resp.aread()
        finally:
            await resp.aclose()
        return resp.status_code


async def load(
    client: Client, n: int, concurrency: int, stream: bool, spread_s: float = 0.0
) -> Sample:
    """``n`` calls from ``concurrency`` clients; client k starts ``k * spread_s /
    concurrency`` late, so clients waiting on a slow upstream do not arrive in waves."""
    from holedger.gateway.upstream import UpstreamError

    sample = Sample()
    counter = iter(range(n))

    async def worker(k: int) -> None:
        await asyncio.sleep(k * spread_s / concurrency)
        for i in counter:
            raw = json.dumps(request_body(client.fmt, i, stream)).encode()
            t0 = time.perf_counter()
            try:
                status = await client.call(raw, stream)
            except UpstreamError:
                status = 0
            dt = time.perf_counter() - t0
            if status == 200:
                sample.latencies.append(dt)
            else:
                sample.errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
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
    clients: int,
    latency_s: float,
    stream: bool,
    rounds: int,
    meters: dict[str, Meters],
    fmt: str = "chat",
) -> dict[str, Sample]:
    conns = {name: Client(url, key, fmt) for name, (url, key) in targets.items()}
    stream = stream and fmt != "embeddings"
    for client in conns.values():  # warm up every path
        await load(client, 40, 4, stream)
    merged = {name: Sample() for name in targets}
    per_round = max(clients, requests // rounds)
    for _ in range(rounds):
        for name, client in conns.items():
            meter = meters[name]
            before = meter.read()
            s = await load(client, per_round, clients, stream, latency_s)
            if meter.drain:
                # The round ends when its events are written: the writer's work counts
                # in this round's time and CPU, not in the next path's round.
                t0, c0 = time.perf_counter(), time.process_time()
                answer = await asyncio.to_thread(httpx.post, meter.drain, timeout=180)
                s.drain_s = time.perf_counter() - t0
                s.elapsed += s.drain_s
                s.backlog = int(answer.json()["backlog"])
                if not answer.json()["flushed"]:
                    print("  warning: the gateway's writer did not drain within 120 s")
                drain_cpu = time.process_time() - c0  # this client's, for the drain call
            else:
                drain_cpu = 0.0
            after = meter.read()
            s.proxy_cpu, s.writer_cpu, s.upstream_cpu, s.client_cpu = (
                a - b for a, b in zip(after[:4], before[:4], strict=True)
            )
            s.client_cpu -= drain_cpu
            s.busy, s.ticks = after[4][0] - before[4][0], after[4][1] - before[4][1]
            merged[name].add(s)
    for client in conns.values():
        await client.http.aclose()
    return merged


# ---------------------------------------------------------------------------- report


def report(
    level: str, samples: dict[str, Sample], stream: bool, rounds: int, fmt: str = "chat"
) -> None:
    clients, latency = parse_level(level)
    direct = samples["direct"]
    d50, d99 = pct(direct.latencies, 0.5), pct(direct.latencies, 0.99)
    mode = "streaming" if stream and fmt != "embeddings" else "non-streaming"
    print(
        f"\n{fmt} (/v1{PATHS[fmt]}): {clients} concurrent client(s), upstream answers after "
        f"{latency:g} ms, {mode}"
        "; latency in ms (200 answers only), CPU in ms per request"
    )
    head = f"  {'path':<9} {'p50':>8} {'p99':>8} {'req/s':>7} {'errors':>6}"
    head += f" {'+p50':>7} {'+p99':>7} {'proxy':>6} {'writer':>6} {'upstrm':>6} {'client':>6}"
    head += f" {'busy':>5}"
    print(head)
    added: dict[str, tuple[float, float]] = {}
    for name, s in samples.items():
        p50, p99 = pct(s.latencies, 0.5), pct(s.latencies, 0.99)
        n = max(s.count, 1)
        rps = s.count / s.elapsed if s.elapsed else float("nan")
        line = f"  {name:<9} {p50:8.2f} {p99:8.2f} {rps:7.0f} {s.errors:>6}"
        if name == "direct":
            line += f" {'':>7} {'':>7} {'':>6} {'':>6}"
        else:
            added[name] = (p50 - d50, p99 - d99)
            line += f" {p50 - d50:7.2f} {p99 - d99:7.2f} {s.proxy_cpu / n * 1000:6.2f}"
            line += f" {s.writer_cpu / n * 1000:6.2f}" if name == "gateway" else f" {'':>6}"
        line += f" {s.upstream_cpu / n * 1000:6.2f} {s.client_cpu / n * 1000:6.2f}"
        line += f" {100 * s.busy / max(s.ticks, 1):4.0f}%"
        print(line)
    if "gateway" in added and "litellm" in added:
        g50, g99 = added["gateway"]
        l50, l99 = added["litellm"]
        print(f"  added latency, gateway / litellm: p50 {_ratio(g50, l50)}, p99 {_ratio(g99, l99)}")
    gateway = samples.get("gateway")
    if gateway is not None and gateway.drain_s:
        print(
            f"  gateway events waiting when a round ended: at most {gateway.backlog}; written "
            f"{1000 * gateway.drain_s / rounds:.0f} ms later on average (counted in req/s)"
        )
    if "gateway" in added and "floor" in added:
        g50, g99 = added["gateway"]
        f50, f99 = added["floor"]
        print(
            f"  the floor adds p50 {f50:.2f} ms, p99 {f99:.2f} ms; the gateway's own work "
            f"beyond it: p50 {g50 - f50:.2f} ms, p99 {g99 - f99:.2f} ms"
        )
    if latency == 0 and clients > 1 and "gateway" in samples:
        print(cpu_budget_line(clients, samples))
    if "gateway" in added:
        g50, g99 = added["gateway"]
        verdict = "within" if g50 <= 2 and g99 <= 10 else "over"
        busy = max(100 * s.busy / max(s.ticks, 1) for s in samples.values())
        note = ""
        if busy >= 90:
            note = " (machine busy: the added latency includes queueing for CPU)"
        print(f"  gateway added p50 {g50:.2f} ms, p99 {g99:.2f} ms: {verdict} 2/10 ms{note}")


def cpu_budget_line(clients: int, samples: dict[str, Sample], added_ms: float = 2.0) -> str:
    """The most CPU per call a proxy may spend to add at most ``added_ms`` at a saturated
    level, on this machine, by Little's law.

    With ``clients`` requests always in flight, the mean latency is clients / throughput.
    Adding at most ``added_ms`` to the direct path's mean therefore needs a throughput of at
    least clients / (L_direct + added_ms); the machine's cores give at most cores / (CPU per
    call, all processes together), so the whole call (client, upstream and proxy) may cost
    at most cores * (L_direct + added_ms) / clients of CPU. What the client and the
    upstream spend on the gateway's path is measured; the proxy's share is the rest. It is
    a necessary condition (it assumes every core busy all the time), not a sufficient one.
    """
    cores = os.cpu_count() or 1
    direct = samples["direct"]
    direct_mean_ms = 1000 * clients * direct.elapsed / max(direct.count, 1)
    whole_ms = cores * (direct_mean_ms + added_ms) / clients
    gateway = samples["gateway"]
    n = max(gateway.count, 1)
    others_ms = 1000 * (gateway.upstream_cpu + gateway.client_cpu) / n
    budget = whole_ms - others_ms
    spent = [
        f"{name} {1000 * s.proxy_cpu / max(s.count, 1):.2f}"
        for name, s in samples.items()
        if name != "direct"
    ]
    return (
        f"  CPU budget: to add at most {added_ms:g} ms here, a proxy may spend at most "
        f"{budget:.2f} ms of CPU per call on this machine ({cores} cores; direct mean "
        f"{direct_mean_ms:.2f} ms, client and upstream {others_ms:.2f} ms per call); "
        f"spent: {', '.join(spent)}"
    )


def _ratio(a: float, b: float) -> str:
    if b <= 0:
        return "n/a (litellm added nothing measurable)"
    return f"{a / b:.2f}"


def parse_level(text: str) -> tuple[int, float]:
    clients, _, latency = text.partition("@")
    return int(clients), float(latency or 0)


# ---------------------------------------------------------------------------- main


def run_level(
    args: argparse.Namespace, level: str, tmp: Path, fmt: str = "chat"
) -> dict[str, Sample]:
    clients, latency_ms = parse_level(level)
    tag = f"{fmt}-{level.replace('@', '_')}"
    path = PATHS[fmt]
    ledger_url = f"sqlite:///{tmp / f'ledger-{tag}.db'}"
    token = prepare_ledger(ledger_url)
    up_port, gw_port, ll_port, fl_port = free_port(), free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    sim = [sys.executable, "-m", "holedger.cli", "sim", "serve", "--port", str(up_port)]
    sim += ["--latency", str(latency_ms / 1000)]
    info = tmp / f"gateway-{tag}.json"
    gw = [sys.executable, __file__, "--serve-gateway", ledger_url, upstream, str(gw_port)]
    gw += ["--gateway-info", str(info)]
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(process(sim, tmp / f"sim-{tag}.log"))
        wait_ready(f"{upstream}/models", up)
        gp = stack.enter_context(process(gw, tmp / f"gateway-{tag}.log"))
        wait_ready(f"http://127.0.0.1:{gw_port}/v1/models", gp)
        gateway_info = json.loads(info.read_text())
        writer, drain = gateway_info["writer_tid"], gateway_info["drain"]
        targets = {
            "direct": (f"{upstream}{path}", "unused"),
            "gateway": (f"http://127.0.0.1:{gw_port}/v1{path}", token),
        }
        meters = {
            "direct": Meters(upstream=up.pid),
            "gateway": Meters(proxy=gp.pid, writer=writer, upstream=up.pid, drain=drain),
        }
        if not args.no_floor:
            fl = [sys.executable, __file__, "--serve-floor", upstream, str(fl_port)]
            fp = stack.enter_context(process(fl, tmp / f"floor-{tag}.log"))
            wait_ready(f"http://127.0.0.1:{fl_port}/v1/models", fp)
            targets["floor"] = (f"http://127.0.0.1:{fl_port}/v1{path}", "unused")
            meters["floor"] = Meters(proxy=fp.pid, upstream=up.pid)
        command = None if args.no_litellm or fmt != "chat" else litellm_command()
        if command is not None:
            cfg = tmp / "litellm.yaml"
            litellm_config(cfg, upstream)
            ll_args = [command, "--config", str(cfg), "--port", str(ll_port), "--num_workers", "1"]
            master = "sk-" + secrets.token_hex(32)
            env = dict(os.environ, LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False")
            env["LITELLM_MASTER_KEY"] = master
            lp = stack.enter_context(process(ll_args, tmp / f"litellm-{tag}.log", env=env))
            try:
                wait_ready(f"http://127.0.0.1:{ll_port}/health/liveliness", lp, timeout=180)
                targets["litellm"] = (f"http://127.0.0.1:{ll_port}/v1/chat/completions", master)
                meters["litellm"] = Meters(proxy=lp.pid, upstream=up.pid)
            except RuntimeError as exc:
                print(f"litellm: not measured ({exc})")
        return asyncio.run(
            bench(
                targets,
                args.requests,
                clients,
                latency_ms / 1000,
                args.stream,
                args.rounds,
                meters,
                fmt,
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="CLIENTS@MS: concurrent clients, and the upstream's time to answer in ms.",
    )
    parser.add_argument("--requests", type=int, default=1500, help="per path and level")
    parser.add_argument(
        "--levels", default="1,32@200,32", help="CLIENTS[@MS],... (default: %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per level")
    parser.add_argument("--stream", action="store_true", help="streamed (SSE) completions")
    parser.add_argument(
        "--formats",
        default="chat",
        help="wire formats to measure, of chat,responses,messages,embeddings (default: chat)",
    )
    parser.add_argument("--no-litellm", action="store_true", help="measure no LiteLLM proxy")
    parser.add_argument(
        "--no-floor", action="store_true", help="measure no bare pass-through proxy (the floor)"
    )
    parser.add_argument("--serve-gateway", nargs=3, metavar=("LEDGER", "UPSTREAM", "PORT"))
    parser.add_argument("--serve-floor", nargs=2, metavar=("UPSTREAM", "PORT"))
    parser.add_argument("--gateway-info", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        ledger_url, upstream, port = args.serve_gateway
        serve_gateway_process(ledger_url, upstream, int(port), args.gateway_info)
        return
    if args.serve_floor:
        serve_floor_process(args.serve_floor[0], int(args.serve_floor[1]))
        return
    if args.no_litellm:
        print("litellm: not measured (--no-litellm)")
    elif litellm_command() is None:
        print("litellm: not measured (no 'litellm' command; set LITELLM_BIN)")
    print(
        "Columns: +p50/+p99 = path's p50/p99 minus the direct path's; proxy = CPU of the "
        "proxy process, writer = of the gateway's event writer thread (included in proxy), "
        "upstrm = of the simulator, client = of this load generator; busy = whole machine. "
        "floor = a bare pass-through proxy on the gateway's server stack (no checks, no events)."
    )
    tmp = Path(tempfile.mkdtemp(prefix="holedger-bench-"))
    try:
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        unknown = [f for f in formats if f not in PATHS]
        if unknown:
            parser.error(f"unknown format {unknown[0]!r}: choose from {', '.join(PATHS)}")
        for fmt in formats:
            for level in args.levels.split(","):
                report(level, run_level(args, level, tmp, fmt), args.stream, args.rounds, fmt)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()[0]
    print(f"\nload average after the run: {load1:.1f} on {os.cpu_count()} CPUs", end="")
    print(" (a loaded machine inflates every added latency)" if load1 > 1 else "")


if __name__ == "__main__":
    main()
