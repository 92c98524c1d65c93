"""`holedger run open --protocol solve-evolve`: its options and the opening itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from holedger.errors import UsageError
from holedger.output import emit_json
from holedger.replay.report import score_text


def open_solve_evolve(
    service: Any,
    task: str,
    optimizer: str,
    backend: str | None,
    descriptor: Any,
    batch: int | None,
    steps: int | None,
    scope: tuple[str, ...],
    step_tokens: int | None,
    stream: Path | None,
    as_json: bool,
) -> None:
    from holedger.server.evolve import EvolveRuns

    if batch is None:
        raise UsageError("--batch is required with --protocol solve-evolve", hint="e.g. --batch 10")
    ids = None if stream is None else _stream_ids(stream)
    runs = EvolveRuns(service)
    offered = ids if ids is not None else [c.id for c in service.task(task).cases("dev")]
    count = steps if steps is not None else max(1, len(offered) // max(batch, 1))
    terms = runs.terms_for(
        task,
        batch=batch,
        steps=count,
        scope=list(scope) or None,
        step_tokens=step_tokens,
        stream=ids,
    )
    opened = runs.open_run(task, terms, optimizer=optimizer, backend=backend, descriptor=descriptor)
    pinned = service.ledger.run_terms(opened.run_id).solve_evolve
    assert pinned is not None
    none = pinned.none_run
    data = {
        "run_id": opened.run_id,
        "protocol": "solve-evolve",
        "task_id": opened.task_id,
        "seed": opened.seed_commit,
        "backend": opened.backend,
        "optimizer_token": opened.optimizer_token,
        "stream_digest": pinned.stream_digest,
        "batch": pinned.batch,
        "steps": pinned.steps,
        "scope": pinned.scope,
        "step_tokens": pinned.step_tokens,
        "none_run": None if none is None else {"run_id": none.run_id, "j": none.j},
    }
    if as_json:
        emit_json(data)
        return
    click.echo(f"run      {opened.run_id} (solve-evolve)")
    click.echo(f"task     {opened.task_id}")
    click.echo(
        f"stream   {pinned.steps} steps x {pinned.batch} cases ({pinned.stream_digest[:16]})"
    )
    click.echo(f"scope    {', '.join(pinned.scope)}")
    if none is not None:
        click.echo(f"Base     {score_text(none.j)} (NONE run {none.run_id})")
    click.echo(f"token    {opened.optimizer_token}")


def _stream_ids(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the stream {path}: {exc}") from exc
    ids = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not ids:
        raise UsageError(f"the stream {path} lists no case", hint="one dev case id a line")
    return ids


def evolve_options(fn: Any) -> Any:
    options = [
        click.option(
            "--protocol",
            type=click.Choice(["search", "solve-evolve"]),
            default="search",
            show_default=True,
            help="search (dev/val search, nominate, held-out score) or solve-evolve.",
        ),
        click.option("--batch", type=int, default=None, help="solve-evolve: cases per step."),
        click.option(
            "--steps", type=int, default=None, help="solve-evolve: steps (default: all batches)."
        ),
        click.option(
            "--scope",
            multiple=True,
            help="solve-evolve: a folder of the seed the evolver may change (repeatable; "
            "default every folder outside the immutable paths).",
        ),
        click.option(
            "--step-tokens", type=int, default=None, help="solve-evolve: evolver tokens per step."
        ),
        click.option(
            "--stream",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="solve-evolve: a file of dev case ids, one a line, in stream order.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn
