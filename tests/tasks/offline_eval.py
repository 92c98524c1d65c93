"""Test-only helpers: the simulator behind a tiny local HTTP server, and in-process trials.

The openai SDK needs an HTTP endpoint, so the tests put ``SimulatedModel`` behind a
stdlib ``ThreadingHTTPServer`` on 127.0.0.1. A trial runs a candidate's ``harness``
package in this process (``runpy``), with the case on stdin and the answer captured from
stdout, which avoids paying the openai import once per trial.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import threading
from collections.abc import Callable, Iterator
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from holedger.gateway.simulator import (
    SimulatedModel,
    SimulatorRequestError,
    SimulatorTransientError,
)


def _handler(model: SimulatedModel, calls: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: dict[str, Any], retry: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if retry:
                self.send_header("retry-after-ms", "5")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            ids = [
                {"id": name, "object": "model", "owned_by": "holedger"} for name in model.models()
            ]
            self._send(200, {"object": "list", "data": ids})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length))
            try:
                reply = model.complete(body)
            except SimulatorTransientError as exc:
                calls.append({"status": exc.status})
                self._send(
                    exc.status,
                    {
                        "error": {
                            "message": str(exc),
                            "type": "server_error",
                            "param": None,
                            "code": None,
                        }
                    },
                    retry=True,
                )
                return
            except SimulatorRequestError as exc:
                self._send(
                    400,
                    {
                        "error": {
                            "message": str(exc),
                            "type": "invalid_request_error",
                            "param": None,
                            "code": None,
                        }
                    },
                )
                return
            calls.append({"status": 200, "usage": reply["usage"]})
            self._send(200, reply)

    return Handler


@contextlib.contextmanager
def simulator_server(seed: int = 0) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serve a fresh SimulatedModel; yields (base URL ending in /v1, call log)."""
    calls: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(SimulatedModel(seed), calls))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", calls
    finally:
        server.shutdown()
        server.server_close()


def _forget_harness() -> None:
    for name in [n for n in sys.modules if n == "harness" or n.startswith("harness.")]:
        del sys.modules[name]


def run_trial_in_process(candidate: Path, case_input: dict[str, Any], base_url: str) -> Any:
    """Run ``python -m harness`` of ``candidate`` in this process; its parsed stdout or None."""
    _forget_harness()
    env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sim-trial-token"}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_path = list(sys.path)
    os.environ.update(env)
    sys.path.insert(0, str(candidate))
    stdin, stdout = io.StringIO(json.dumps(case_input)), io.StringIO()
    saved_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            old_stdin, sys.stdin = sys.stdin, stdin
            try:
                runpy.run_module("harness", run_name="__main__", alter_sys=False)
            except Exception:
                return None
            except SystemExit:
                pass
            finally:
                sys.stdin = old_stdin
    finally:
        sys.dont_write_bytecode = saved_bytecode
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _forget_harness()
    try:
        return json.loads(stdout.getvalue().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def mean_score(
    candidate: Path,
    cases: list[tuple[dict[str, Any], Callable[[Any], Fraction]]],
    k: int = 3,
    seed: int = 0,
) -> Fraction:
    """Mean verifier score of ``candidate`` over ``cases`` (input, scorer), K attempts each."""
    total = Fraction(0)
    with simulator_server(seed) as (base_url, _calls):
        for _attempt in range(k):
            for case_input, scorer in cases:
                total += scorer(run_trial_in_process(candidate, case_input, base_url))
    return total / (k * len(cases))
