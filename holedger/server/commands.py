"""Command-line commands of the server room.

``holedger run open``, ``holedger candidate commit``, ``holedger eval``,
``holedger nominate`` and ``holedger serve``. Each works on the home's ledger directly
(the trusted side); an optimizer in a sandbox uses the HTTP API instead.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import click

from holedger.errors import UsageError
from holedger.numbers import Mean, amount, exact, quantities_for_json, se_text
from holedger.output import emit_json, settings
from holedger.replay.report import counted, score_text
from holedger.sandboxes import BACKEND_NAMES
from holedger.server import MAX_ATTEMPTS
from holedger.server.descriptor_options import descriptor_from, descriptor_options
from holedger.server.evolve_commands import evolve_options, open_solve_evolve


@contextlib.contextmanager
def _service(ctx: click.Context, workers: int = 2) -> Iterator[Any]:
    from holedger.ledger.store import Ledger
    from holedger.server.progress import terminal_progress
    from holedger.server.service import RunService, ServerConfig

    cfg = settings(ctx)
    ledger = Ledger.from_settings(cfg)
    service = RunService(cfg, ledger, ServerConfig(workers=workers))
    try:
        with terminal_progress(service):
            yield service
    finally:
        service.close()
        ledger.close()


def _json_opt(fn: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


@click.command("open")
@click.option("--task", "task", required=True, help="Task name or folder.")
@click.option("--optimizer", default="unnamed", show_default=True, help="Optimizer label.")
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default=None,
    help="Sandbox backend of the run's trials (default: the strongest available).",
)
@click.option(
    "--seed-variant",
    default=None,
    metavar="NAME",
    help="Start from the task's seed variant NAME (its folder variants/NAME laid over the "
    "seed, e.g. anthropic-sdk) instead of its own seed.",
)
@descriptor_options
@evolve_options
@_json_opt
@click.pass_context
def run_open(
    ctx: click.Context,
    task: str,
    optimizer: str,
    backend: str | None,
    protocol: str,
    batch: int | None,
    steps: int | None,
    scope: tuple[str, ...],
    step_tokens: int | None,
    stream: Path | None,
    seed_variant: str | None,
    opt_model: str | None,
    opt_family: str | None,
    opt_release: str | None,
    opt_harness: str | None,
    opt_scope: str | None,
    opt_replicate: int | None,
    as_json: bool,
) -> None:
    """Open a run on TASK: pin the task and its seed baseline, commit the seed.

    The first run of a task also computes the task's seed baseline E(H0) (a baseline run
    of its own); --seed-variant starts from one of the task's seed variants, which has a
    baseline of its own. Prints the run id and the optimizer token (shown once). --model and
    --harness (with --family, --release, --harness-scope, --replicate) sign who runs the
    search into RunOpened: cross-run analyses group runs by these fields only.

    --protocol solve-evolve opens a solve-evolve run instead (docs/PROTOCOL.md): a pinned
    stream of dev cases (--stream FILE, one id a line; default the dev split in order)
    scored --batch cases at a time for --steps steps, each under the harness before the
    step, the evolver changing only the --scope folders between steps. The first run of a
    stream also runs its NONE run (the seed throughout) for Base.
    """
    descriptor = descriptor_from(
        opt_model, opt_family, opt_release, opt_harness, opt_scope, opt_replicate
    )
    if protocol == "solve-evolve":
        if seed_variant is not None:
            raise UsageError(
                "--seed-variant is for runs of the search protocol",
                hint="open the solve-evolve run without it",
            )
        with _service(ctx) as service:
            open_solve_evolve(
                service,
                task,
                optimizer,
                backend,
                descriptor,
                batch,
                steps,
                scope,
                step_tokens,
                stream,
                as_json,
            )
        return
    given = [
        n
        for n, v in (
            ("--batch", batch),
            ("--steps", steps),
            ("--scope", scope),
            ("--step-tokens", step_tokens),
            ("--stream", stream),
        )
        if v
    ]
    if given:
        raise UsageError(
            f"{given[0]} belongs to solve-evolve runs", hint="add --protocol solve-evolve"
        )
    with _service(ctx) as service:
        opened = service.open_run(
            task,
            optimizer=optimizer,
            backend=backend,
            descriptor=descriptor,
            seed_variant=seed_variant,
        )
    baseline = opened.seed_baseline
    data = {
        "run_id": opened.run_id,
        "task_id": opened.task_id,
        "seed": opened.seed_commit,
        "seed_variant": seed_variant,
        "backend": opened.backend,
        "optimizer_token": opened.optimizer_token,
        "descriptor": None if descriptor is None else descriptor.model_dump(mode="json"),
        "seed_baseline": None
        if baseline is None
        else {**baseline.model_dump(mode="json"), "e_h0": baseline.e_h0},
    }
    if as_json:
        emit_json(data)
        return
    click.echo(f"run      {opened.run_id}")
    click.echo(f"task     {opened.task_id}")
    click.echo(f"seed     {opened.seed_commit}" + (f" ({seed_variant})" if seed_variant else ""))
    if baseline is not None:
        e0 = score_text(baseline.e_h0)
        click.echo(f"E(H0)    {e0} (K={baseline.k}, baseline run {baseline.baseline_run_id})")
    click.echo(f"token    {opened.optimizer_token}")


@click.command("recover")
@click.argument("run")
@_json_opt
@click.pass_context
def run_recover(ctx: click.Context, run: str, as_json: bool) -> None:
    """Record the requests of RUN a stopped server left without trials, as not run.

    A server killed while trials ran (or an evaluation that failed before recording
    them) leaves their accepted request without trials or projection, and replay fails
    on it. This records each such trial as not run (score 0, a sandbox_error violation;
    the model calls it made are its tokens), then the request's projection. Requests
    still being evaluated by a live process are left alone. Every later eval and
    nominate of RUN does the same first.
    """
    with _service(ctx) as service:
        run_id = service.ledger.resolve_run(run)
        found = service.recover(run_id)
    if as_json:
        emit_json(found.as_json())
        return
    for request_id in found.recorded:
        click.echo(f"recorded request {request_id}: its trials as not run, and its projection")
    for request_id in found.running:
        click.echo(f"request {request_id} is still being evaluated; left alone")
    if found.unscored_nomination is not None:
        click.echo(
            "the nomination's held-out scoring was cut short: finish it with "
            f"'holedger nominate {run_id} {found.unscored_nomination}'"
        )
    if not (found.recorded or found.running or found.unscored_nomination):
        click.echo(f"run {run_id}: nothing left unrecorded")


@click.command("abort")
@click.argument("run")
@click.option("--reason", "why", required=True, help="Why the run is abandoned (recorded).")
@_json_opt
@click.pass_context
def run_abort(ctx: click.Context, run: str, why: str, as_json: bool) -> None:
    """Close RUN without a score, as aborted, recording the reason.

    For a run that will not finish: its optimizer stopped, was interrupted or gave up.
    Requests a stopped server left without trials are first recorded as not run (as 'run
    recover' does); a nomination whose held-out scoring was cut short stays unscored.
    Then a signed RunClosed with reason "aborted". Replay verifies the run as "VERIFIED
    (aborted)"; the analyses leave it out.
    """
    from holedger.server.lifecycle import abort_run

    with _service(ctx) as service:
        run_id = service.ledger.resolve_run(run)
        done = abort_run(service, run_id, why)
    if as_json:
        emit_json(done.as_json())
        return
    for request_id in done.recovered:
        click.echo(f"recorded request {request_id}: its trials as not run, and its projection")
    if done.nominated is not None and not done.scored:
        click.echo(f"the nomination of {done.nominated[:12]} stays unscored")
    click.echo(f"run {run_id} closed as aborted: {done.why}")
    click.echo(f"verify it: holedger replay {run_id}")


@click.group("candidate")
def candidate_group() -> None:
    """Candidate harnesses of a run."""


@candidate_group.command("commit")
@click.argument("run")
@click.argument("path", type=click.Path(exists=True, file_okay=True, path_type=Path))
@click.option("--parent", default=None, help="Parent candidate (default: the seed).")
@_json_opt
@click.pass_context
def candidate_commit(
    ctx: click.Context, run: str, path: Path, parent: str | None, as_json: bool
) -> None:
    """Commit the candidate folder (or .tar/.tar.gz) PATH into RUN."""
    from holedger.server.candidates import read_tar

    with _service(ctx) as service:
        run_id = service.ledger.resolve_run(run)
        source: Any = path
        if path.is_file():
            source = read_tar(path.read_bytes(), service.tree_limits)
        result = service.commit_candidate(run_id, source, parent)
    data = {
        "run_id": run_id,
        "candidate": result.candidate,
        "index": result.index,
        "parent": result.parent,
        "changed_paths": result.changed_paths,
        "created": result.created,
    }
    if as_json:
        emit_json(data)
        return
    verb = "committed" if result.created else "already committed"
    click.echo(
        f"{verb} candidate {result.index}: {result.candidate} "
        f"({counted(len(result.changed_paths), 'changed path')})"
    )


@click.command("eval")
@click.argument("run")
@click.argument("candidate")
@click.option(
    "--split",
    type=click.Choice(["dev", "val", "test"]),
    required=True,
    help="dev or val. test is closed to search: asking is refused, and the refusal recorded.",
)
@click.option("--cases", default=None, help="Comma-separated case ids (default: the split).")
@click.option("--attempts", type=click.IntRange(1, MAX_ATTEMPTS), default=1, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@_json_opt
@click.pass_context
def eval_cmd(
    ctx: click.Context,
    run: str,
    candidate: str,
    split: str,
    cases: str | None,
    attempts: int,
    workers: int,
    as_json: bool,
) -> None:
    """Evaluate CANDIDATE (commit prefix or "seed") of RUN on dev or val cases."""
    case_ids = [c.strip() for c in cases.split(",") if c.strip()] if cases else None
    if cases is not None and not case_ids:
        raise UsageError("--cases is empty")
    with _service(ctx, workers) as service:
        run_id = service.ledger.resolve_run(run)
        result = service.evaluate(run_id, candidate, split, case_ids, attempts)
    data = {"run_id": run_id, **result.as_json(), "warnings": result.warnings}
    if as_json:
        _warn(result.warnings)  # on stderr with --json too: stdout stays one document
        # The number rule for the budget's quantities; the projection stays exactly as
        # it was shown and signed.
        for key in ("cost", "budget_used"):
            data[key] = quantities_for_json(data[key], ["case_passes"])
        emit_json(data)
        return
    click.echo(f"request {result.request_id} accepted ({result.policy})")
    body = result.projection
    if result.policy == "aggregate":
        click.echo(f"mean {_aggregate_text(body)}")
    else:
        for case_id, entry in body["cases"].items():
            trials = len(entry.get("trials") or [])
            mean = Mean.of(exact(entry["mean"]) or Fraction(0), 1, trials)
            click.echo(f"  {case_id}  mean {mean.text() if trials else score_text(entry['mean'])}")
    used = result.budget_after[split]
    passes = amount(used["case_passes"])
    click.echo(f"{split} budget used: {used['calls']} calls, {passes} case-passes")
    _warn(result.warnings)


def _aggregate_text(body: dict[str, Any]) -> str:
    """A val aggregate with its counts: ``0.600: 6 of 10 trials over 5 cases``."""
    value, cases, trials = exact(body.get("mean")), body.get("cases"), body.get("trials")
    if value is None or not isinstance(cases, int) or not isinstance(trials, int) or not cases:
        return score_text(body.get("mean"))
    if trials % cases:  # not the same number of trials per case: no single count to show
        return f"{score_text(value)} over {cases} cases ({trials} trials)"
    return Mean.of(value, cases, trials // cases).text()


def _warn(lines: list[str]) -> None:
    for line in lines:
        click.echo(f"warning: {line}", err=True)


@click.command("nominate")
@click.argument("run")
@click.argument("candidate")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@_json_opt
@click.pass_context
def nominate_cmd(ctx: click.Context, run: str, candidate: str, workers: int, as_json: bool) -> None:
    """Nominate CANDIDATE of RUN (once), score it on the held-out test split, close RUN."""
    with _service(ctx, workers) as service:
        run_id = service.ledger.resolve_run(run)
        scored = service.nominate(run_id, candidate)
    cases = len(scored.per_case)
    if as_json:
        emit_json(
            {
                "run_id": scored.run_id,
                "candidate": scored.candidate,
                "k": scored.k,
                "cases": cases,
                "trials": cases * scored.k,
                "e_h_plus": scored.e_h_plus,
                "e_h_plus_se": scored.e_h_plus_se,
                "e_h0": scored.e_h0,
                "e_h0_se": scored.e_h0_se,
                "g": scored.g,
                "per_case": [
                    {"case_id": case_id, "scores": list(scores)}
                    for case_id, scores in scored.per_case.items()
                ],
            }
        )
        return
    g = score_text(scored.g) if scored.g is not None else "undefined (E(H0) = 1)"
    click.echo(f"nominated {scored.candidate}; run {run_id} closed")
    k = scored.k
    plus, zero = se_text(scored.e_h_plus_se, k), se_text(scored.e_h0_se, k)
    click.echo(f"E(H+) {Mean.of(scored.e_h_plus, cases, k).text()} (K = {k}){plus}")
    click.echo(f"E(H0) {Mean.of(scored.e_h0, cases, k).text()} (the pinned seed baseline){zero}")
    click.echo(f"g     {g}")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Also serve the API on this unix socket.",
)
@click.option("--gateway-port", type=click.IntRange(0, 65535), default=8471, show_default=True)
@click.option(
    "--gateway-socket",
    type=click.Path(path_type=Path),
    default=None,
    help="Also serve the gateway on this unix socket.",
)
@click.option("--no-tcp", is_flag=True, help="Listen on the unix sockets only.")
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default=None,
    help="Default sandbox backend of runs (default: the strongest available).",
)
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--executor",
    default=None,
    metavar="URL",
    help="Where trials' sandboxes run: 'local' (default; env HOLEDGER_EXECUTOR).",
)
@_json_opt
@click.pass_context
def serve_cmd(
    ctx: click.Context,
    host: str,
    port: int,
    socket_path: Path | None,
    gateway_port: int,
    gateway_socket: Path | None,
    no_tcp: bool,
    backend: str | None,
    workers: int,
    executor: str | None,
    as_json: bool,
) -> None:
    """Serve the optimizer API and the model gateway until interrupted.

    The gateway reads its upstream, model aliases and limits from HOME/gateway.toml
    (a [gateway] table; docs/GATEWAY.md lists the settings). Without that file it
    serves the offline simulator.
    """
    import json
    import signal
    import threading

    from holedger.ledger.store import Ledger
    from holedger.server.serve import start_server

    if no_tcp and (socket_path is None or gateway_socket is None):
        raise UsageError("--no-tcp needs --socket and --gateway-socket")
    cfg = settings(ctx)
    ledger = Ledger.from_settings(cfg)
    running = start_server(
        cfg,
        ledger,
        host=host,
        port=None if no_tcp else port,
        socket=socket_path,
        gateway_port=None if no_tcp else gateway_port,
        gateway_socket=gateway_socket,
        workers=workers,
        backend=backend,
        executor=executor,
    )
    # Before the URLs are printed: a client that reads them may signal at once.
    stop = threading.Event()
    stopped_by: list[int] = []

    def on_signal(signum: int, _: object) -> None:
        stopped_by.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    urls = running.urls
    described = running.executor.describe()
    if as_json:
        click.echo(json.dumps({**urls, "executor": described}))
    else:
        for url in urls["api"]:
            click.echo(f"api      {url}")
        for url in urls["gateway"]:
            click.echo(f"gateway  {url}")
        extra = [f"{k}={v}" for k, v in described.items() if k != "executor"]
        click.echo(" ".join(["executor", described.get("executor", "?"), *extra]))
    try:
        stop.wait()
        # Evaluations in flight are recorded before the gateway and the ledger close; a
        # second signal abandons them (their accepted requests then lack trials until
        # the next eval, nominate or `run recover` of their run records them as not run).
        abandon = _raise_interrupt
        signal.signal(signal.SIGINT, abandon)
        signal.signal(signal.SIGTERM, abandon)
        if running.service.in_flight:
            busy = counted(
                running.service.in_flight, "evaluation or nomination", "evaluations or nominations"
            )
            click.echo(
                f"stopping: waiting for {busy} in flight to be recorded (a second signal "
                "stops at once; 'holedger run recover RUN' then records them as not run)",
                err=True,
            )
        running.service.drain()
    finally:
        running.stop()
        ledger.close()
    if stopped_by[:1] == [signal.SIGINT]:
        # Stopped by Ctrl-C: the status every interrupted command has (SIGTERM: 0).
        click.echo("holedger: interrupted", err=True)
        sys.exit(130)


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@click.command("rescore")
@click.argument("run")
@click.option(
    "--times",
    type=int,
    default=1,
    show_default=True,
    help="How many times to score the nominee again (each a run of its own).",
)
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@_json_opt
@click.pass_context
def rescore_cmd(ctx: click.Context, run: str, times: int, workers: int, as_json: bool) -> None:
    """Score RUN's nominee again on the test split, TIMES times, outside its budget: each
    re-scoring a signed run of its own bound to RUN (RunOpened.rescore_of) that replay
    verifies; 'holedger analysis bands' derives the resolution band from the pairs."""
    from holedger.server.rescore import Rescored, rescore

    def say(done: Rescored) -> None:
        if not as_json:
            se = "" if done.e_h_plus_se is None else f" ± {score_text(done.e_h_plus_se)}"
            click.echo(
                f"re-scoring {done.index}: run {done.run_id}, E(H+) "
                f"{score_text(done.e_h_plus)}{se}",
                err=True,
            )

    def announce(run_id: str) -> None:
        if not as_json:
            click.echo(f"re-scoring the nominee of {run_id} on the test split, {times} time(s)")

    with _service(ctx, workers) as service:
        out = rescore(service, run, times, progress=say, start=announce)
    if as_json:
        emit_json({"rescorings": [r.as_json() for r in out]})
        return
    click.echo(
        f"{len(out)} re-scoring run(s) closed and scored: {', '.join(r.run_id for r in out)}; "
        "'holedger analysis bands' pairs them with the run"
    )


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    run_group = cli.commands.get("run")
    if not isinstance(run_group, click.Group):
        run_group = click.Group("run", help="Runs.")
        cli.add_command(run_group)
    from holedger.server.run_show import run_show

    run_group.add_command(run_open)
    run_group.add_command(run_show)
    run_group.add_command(run_recover)
    run_group.add_command(run_abort)
    cli.add_command(candidate_group)
    cli.add_command(eval_cmd)
    cli.add_command(nominate_cmd)
    cli.add_command(rescore_cmd)
    cli.add_command(serve_cmd)
