"""`holedger tasks list | show T | verify T | import-vero DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from holedger.errors import VerificationError
from holedger.output import emit_json
from holedger.schemas.task import SPLITS


@click.group("tasks")
def tasks_group() -> None:
    """Task specs, split manifests and their digests."""


@tasks_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(as_json: bool) -> None:
    """The bundled tasks."""
    from holedger.tasks.loader import BUNDLED_DIR, bundled_tasks, read_spec

    rows: list[dict[str, Any]] = []
    for name in bundled_tasks():
        spec = read_spec(BUNDLED_DIR / name)
        rows.append(
            {
                "id": spec.id,
                "title": spec.title,
                "models": spec.models,
                "sizes": dict(spec.splits.sizes),
                "manifest_digest": spec.splits.manifest_digest,
            }
        )
    if as_json:
        emit_json({"tasks": rows})
        return
    for row in rows:
        sizes = "/".join(str(row["sizes"][s]) for s in ("dev", "val", "test"))
        click.echo(f"{row['id']}  dev/val/test {sizes}  {row['title']}")


def _show_data(ref: str) -> dict[str, Any]:
    from holedger.tasks.digests import task_digest
    from holedger.tasks.loader import find_task, read_spec

    root = find_task(ref)
    spec = read_spec(root)
    return {
        "task_digest": task_digest(spec),
        "terms": spec.terms().model_dump(mode="json"),
        "spec": spec.model_dump(mode="json"),
    }


@tasks_group.command("show")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_cmd(task: str, as_json: bool) -> None:
    """A task's spec, its pinned digests and the terms a run pins (no case content)."""
    data = _show_data(task)
    if as_json:
        emit_json(data)
        return
    spec = data["spec"]
    splits = spec["splits"]
    click.echo(f"task            {spec['id']}  {spec['title']}")
    click.echo(f"task digest     {data['task_digest']}")
    click.echo(f"models          {', '.join(spec['models'])}")
    click.echo(f"entrypoint      {' '.join(spec['entrypoint'])}")
    sizes = " / ".join(f"{s} {splits['sizes'][s]}" for s in ("dev", "val", "test"))
    click.echo(f"splits          {sizes}")
    click.echo(f"manifest        {splits['manifest_digest']}")
    click.echo(
        f"verifier        {spec['verifier']['path']}:{spec['verifier']['function']} "
        f"{spec['verifier']['digest']}"
    )
    click.echo(f"seed            {spec['seed']['path']}/ tree {spec['seed']['tree_digest']}")
    click.echo(f"seed commit     {spec['seed']['commit']}")
    click.echo(f"immutable       {', '.join(spec['immutable_paths']) or '-'}")
    click.echo(
        f"K               {spec['k']}   resolution band {spec['resolution_band']}   "
        f"case timeout {spec['case_timeout_s']} s"
    )
    click.echo(f"disclosure      min_aggregate_cases {spec['disclosure']['min_aggregate_cases']}")
    budget = spec["budget"]
    click.echo(
        f"budget          dev {budget['dev']['calls']} calls / {budget['dev']['case_passes']} "
        f"passes, val {budget['val']['calls']} calls / {budget['val']['case_passes']} passes, "
        f"{budget['target_tokens']} target tokens"
    )


@tasks_group.command("verify")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify_cmd(task: str, as_json: bool) -> None:
    """Recompute every digest of a task (or of a split manifest file); exit 1 on a mismatch."""
    from holedger.tasks.loader import check_manifest, read_manifest, verify_task

    path = Path(task)
    if path.is_file() and path.suffix == ".json":
        manifest = read_manifest(path)
        label, checks = f"manifest {path.name}", check_manifest(manifest)
    else:
        spec, checks = verify_task(task)
        label = f"task {spec.id}"
    failed = [c for c in checks if not c.ok]
    if as_json:
        emit_json(
            {
                "subject": label,
                "ok": not failed,
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
            }
        )
    else:
        for check in checks:
            click.echo(f"{'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    if failed:
        raise VerificationError(
            f"{label}: {failed[0].name}: {failed[0].detail}"
            + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""),
            hint="the files no longer match their pinned digests",
        )
    if not as_json:
        click.echo(f"{label}: all {len(checks)} digests verified")


@tasks_group.command("import-vero")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the manifest (default: ./<folder name>.manifest.json).",
)
@click.option("--task-id", default=None, help="Task id in the manifest (default: folder name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def import_vero_cmd(folder: Path, out: Path | None, task_id: str | None, as_json: bool) -> None:
    """Check a VeRO partitions folder and write it as a holedger split manifest."""
    from holedger.tasks.pinning import manifest_text
    from holedger.tasks.vero import import_vero

    manifest = import_vero(folder, task_id)
    out = out or Path(f"{folder.resolve().name}.manifest.json")
    out.write_text(manifest_text(manifest), encoding="utf-8")
    sizes = {s: len(manifest.splits[s]) for s in SPLITS}
    data: dict[str, Any] = {
        "task_id": manifest.task_id,
        "out": str(out),
        "sizes": sizes,
        "split_digests": dict(manifest.split_digests),
        "manifest_digest": manifest.manifest_digest,
        "partition_digest": manifest.source.get("partition_digest"),
    }
    if as_json:
        emit_json(data)
        return
    counts = "/".join(str(v) for v in sizes.values())
    click.echo(f"{manifest.task_id}: dev/val/test {counts}, manifest {manifest.manifest_digest}")
    click.echo(f"wrote {out}")


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(tasks_group)
