"""Command-line commands of the sandboxes room: ``holedger doctor``, ``holedger sandbox ...``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from holedger.output import console, emit_json, table

# Sections other rooms add to `holedger doctor` (the gateway: its upstreams). Each is
# called with the settings and returns its --json key, its JSON value, and a function
# that prints it as text.
DoctorSection = tuple[str, Any, Callable[[], None]]
DOCTOR_SECTIONS: list[Callable[[Any], DoctorSection]] = []


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def doctor_cmd(settings: Any, as_json: bool) -> None:
    """Which sandbox backends work on this machine, and why or why not; whether each
    upstream of the home's gateway.toml answers and accepts its key (its model list is
    asked, which spends no tokens)."""
    from holedger.sandboxes import AUTOMATIC_ORDER, available_backends

    rows = available_backends()
    default = next((name for name, ok, _ in rows if ok and name in AUTOMATIC_ORDER), None)
    sections = [section(settings) for section in DOCTOR_SECTIONS]
    if as_json:
        emit_json(
            {
                "backends": [{"name": n, "works": ok, "detail": why} for n, ok, why in rows],
                "default": default,
                **{key: data for key, data, _ in sections},
            }
        )
        return
    body = [[name, "yes" if ok else "no", why] for name, ok, why in rows]
    console().print(table("sandbox backends", ["backend", "works", "detail"], body))
    if default:
        click.echo(f"default backend: {default}")
    else:
        click.echo("no isolating backend works here; trials need `--backend process` (unsafe)")
    for _, _, show in sections:
        show()


@click.group("sandbox")
def sandbox_group() -> None:
    """Sandbox maintenance: the docker image, leftovers of crashed trials."""


@sandbox_group.command("build-image")
@click.option("--tag", default=None, help="Image tag (default holedger-sandbox:latest).")
@click.option("--if-needed", is_flag=True, help="Do nothing when the image is current.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def build_image_cmd(tag: str | None, if_needed: bool, as_json: bool) -> None:
    """Build the docker backend's image from this interpreter and the harness runtime."""
    from holedger.sandboxes.image import IMAGE, build_image, current_image

    info = current_image(tag or IMAGE) if if_needed else None
    verb = "up to date:"
    if info is None:
        info, verb = build_image(tag or IMAGE), "built"
    if as_json:
        emit_json(
            {
                "tag": info.tag,
                "id": info.image_id,
                "runtime": info.runtime_key,
                "size_bytes": info.size_bytes,
                "built": verb == "built",
            }
        )
        return
    click.echo(
        f"{verb} {info.tag} ({info.image_id[:19]}, {info.size_bytes // (1 << 20)} MiB, "
        f"runtime {info.runtime_key})"
    )


@sandbox_group.command("gc")
@click.option(
    "--all", "everything", is_flag=True, help="Also remove trial containers still in time."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gc_cmd(everything: bool, as_json: bool) -> None:
    """Remove what crashed trials left: empty trial cgroups and expired trial containers."""
    from holedger.sandboxes.cgroups import manager
    from holedger.sandboxes.docker_backend import DockerBackend

    groups = manager().collect_garbage() if manager().usable else []
    containers: list[str] = []
    docker = DockerBackend()
    docker_ok, why = docker.available()
    if docker_ok:
        containers = docker.collect_garbage(force=everything)
    if as_json:
        emit_json(
            {"cgroups": groups, "containers": containers, "docker": None if docker_ok else why}
        )
        return
    click.echo(f"removed {len(groups)} trial cgroup(s) and {len(containers)} container(s)")
    if not docker_ok:
        click.echo(f"docker skipped: {why}")


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(doctor_cmd)
    cli.add_command(sandbox_group)
