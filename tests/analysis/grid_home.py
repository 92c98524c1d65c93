"""A home holding a small synthetic grid of scored runs with signed descriptors: three
models on a common and a native harness, two tasks, two replicates, one release ladder,
and optimizer-scope gateway calls (so every analysis and every plot has data)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner
from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import GatewayCall, OptimizerDescriptor, TokenUsage

SEED = "a" * 40


def _optimizer_calls(writer: RunWriter, tokens: int) -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    writer.append(
        "GatewayCall",
        GatewayCall(
            call_id=f"opt-{writer.run_id[:8]}",
            scope="optimizer",
            model_requested="opt-model",
            model_served="opt-model",
            allowed=True,
            status=200,
            tokens=TokenUsage(
                input=tokens, cached=0, output=tokens // 4, total=tokens + tokens // 4
            ),
            reserved=0,
            latency_ms=5,
            request_digest=digest,
            response_digest=digest,
        ),
        role="gateway",
    )


def grid_home(root: Path) -> Path:
    home = root / "home"
    assert CliRunner().invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    n = 0
    rows = []
    for task in ("rp-task", "rp-two"):
        for model, native in (
            ("alpha", "alpha-code"),
            ("beta", "beta-cli"),
            ("gamma", "gamma-agent"),
        ):
            for harness, scope in (("opencode", "common"), (native, "native")):
                for replicate in (1, 2):
                    rows.append((task, model, harness, scope, replicate, None, None))
    for release in (1, 2, 3):
        rows.append(
            ("rp-task", f"delta-{release}", "delta-code", "native", 1, "delta", str(release))
        )
    for task, model, harness, scope, replicate, family, release in rows:
        t = terms(seed_commit=SEED)
        if task != t.task_id:
            t = t.model_copy(update={"task_id": task})
        d = OptimizerDescriptor(
            model=model,
            harness=harness,
            harness_scope=scope,  # type: ignore[arg-type]
            replicate=replicate,
            family=family,
            release=release,
        )
        writer = RunWriter(ledger, t, descriptor=d)
        cand = hashlib.sha1(f"{task}{model}{harness}{replicate}".encode()).hexdigest()
        honest_search(writer, SEED, cand)
        _optimizer_calls(writer, 1000 * (1 + n % 7) ** 2)
        honest_finish(writer, cand)
        n += 1
    ledger.close()
    return home
