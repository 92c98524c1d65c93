"""Every command in the README works as written: the tour is run, block by block."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
from pathlib import Path

import click
import pytest

from holedger.cli import cli
from holedger.sandboxes import available_backends

from .conftest import TourState
from .readme_tour import Block, fenced_commands, readme_text, run_blocks, tour_blocks

# The first test to use the `tour` fixture runs the whole demo (minutes on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

GLOBAL_WITH_VALUE = {"--home", "--ledger"}


def _prelude(tour_state: TourState) -> Block:
    """The tour's variables from its first block (RUN), without re-running the demo."""
    lines = [ln for ln in tour_blocks()[0].body.splitlines() if ln.startswith("RUN=")]
    assert lines, "the tour's first block sets RUN"
    return Block(-1, "\n".join(lines) + "\n", False)


def _run(tour: TourState, *blocks: Block) -> tuple[int, str]:
    proc = run_blocks([_prelude(tour), *blocks], tour.folder, timeout=1500)
    return proc.returncode, proc.stdout + proc.stderr


def _resolve(words: list[str]) -> click.Command | None:
    """The click command that ``holedger WORDS...`` names, or None when there is none."""
    command: click.Command = cli
    rest = list(words)
    while rest and rest[0].startswith("-"):
        opt = rest.pop(0)
        if opt in GLOBAL_WITH_VALUE and rest:
            rest.pop(0)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        if sub is None:
            return None
        command, rest = sub, rest[1:]
        while rest and rest[0].startswith("-"):
            rest.pop(0)
    return command


def named_commands() -> list[list[str]]:
    """Every ``holedger ...`` invocation in the README: fenced lines and `inline code`."""
    found = []
    texts = fenced_commands() + re.findall(r"`(holedger [^`]+)`", readme_text())
    for text in texts:
        for part in re.split(r"&&|\|\||\||;|\$\(", text):
            part = part.strip()
            if part.startswith("holedger "):
                try:
                    words = shlex.split(part)
                except ValueError:
                    words = part.split()
                args = [w for w in words[1:] if not w.startswith("-")]
                if args and args[0].isupper():
                    continue  # a placeholder, as in `holedger COMMAND --help`
                found.append(words[1:])
    return found


def test_readme_keeps_the_first_two_commands_and_their_markers() -> None:
    text = readme_text()
    assert "<!-- first-command -->\n```\npip install . && holedger demo\n```" in text
    assert (
        "<!-- test-command -->\n```\npip install -e '.[test]' && python -m pytest -q\n```" in text
    )
    assert text.index("<!-- first-command -->") < text.index("## A tour, command by command")


def test_every_holedger_command_named_in_the_readme_exists() -> None:
    commands = named_commands()
    assert len(commands) >= 15
    missing = [" ".join(w) for w in commands if _resolve(w) is None]
    assert missing == []
    top = {w[0] for w in commands if w and not w[0].startswith("-")}
    for name in ("demo", "replay", "report", "init", "serve", "run", "eval", "nominate"):
        assert name in top, f"the README never names `holedger {name}`"


def test_every_subcommand_is_in_the_command_reference() -> None:
    text = readme_text()
    reference = text[text.index("## Command reference") :]
    for name, command in cli.commands.items():
        assert f"holedger {name}" in reference, name
        if isinstance(command, click.Group):
            for sub in command.commands:
                assert f"holedger {name} {sub}" in reference, f"{name} {sub}"


def test_tour_replay_and_report(tour: TourState) -> None:
    code, out = _run(tour, tour_blocks()[1])
    assert code == 0, out[-3000:]
    assert "VERIFIED" in out
    replay = json.loads((tour.folder / "replay.json").read_text())
    assert replay["verified"] is True
    assert (tour.folder / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_tour_one_byte_edit_is_named_then_restored(tour: TourState) -> None:
    blocks = tour_blocks()
    code, out = _run(tour, blocks[2])
    assert code == 0, out[-3000:]
    seq = int(re.search(r"changed one byte of the event at seq (\d+)", out).group(1))  # type: ignore[union-attr]
    assert "replay exit status: 1" in out
    assert "FAILED" in out
    assert re.search(rf"\b{seq}\b.*TrialCompleted", out), out[-3000:]
    # the JSON form names the same event
    proc = run_blocks(
        [
            _prelude(tour),
            Block(0, 'holedger replay "$RUN" --json > tampered.json || true\n', False),
        ],
        tour.folder,
    )
    assert proc.returncode == 0
    report = json.loads((tour.folder / "tampered.json").read_text())
    assert report["verified"] is False
    assert any(f["seq"] == seq and f["type"] == "TrialCompleted" for f in report["failures"])
    code, out = _run(tour, blocks[3])
    assert code == 0, out[-3000:]
    assert "VERIFIED" in out


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.postgres
def test_tour_postgresql(tour: TourState) -> None:
    block = next(b for b in tour_blocks() if "postgresql+psycopg" in b.body)
    if not _postgres_up():
        pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
    if block.slow and os.environ.get("HOLEDGER_TEST_SLOW_TOUR") != "1":
        # A second full demo (and baseline) on PostgreSQL; the fast part is run instead.
        body = "\n".join(
            ln.replace(" demo", " init") for ln in block.body.splitlines() if ln.strip()
        )
        block = Block(block.index, body + "\n", False)
    code, out = _run(tour, block)
    assert code == 0, out[-3000:]


def test_tour_gateway_upstream_over_http(tour: TourState) -> None:
    block = next(b for b in tour_blocks() if "sim serve" in b.body)
    isolating = [(ok, f"{name}: {why}") for name, ok, why in available_backends()]
    if not any(ok for ok, named in isolating if not named.startswith("process")):
        # `holedger eval` refuses to run a trial unisolated unless told to.
        pytest.skip("no isolating sandbox backend (" + "; ".join(n for _, n in isolating) + ")")
    code, out = _run(tour, block)
    assert code == 0, out[-3000:]
    evaluation = json.loads((tour.folder / "eval.json").read_text())
    assert evaluation["split"] == "dev"
    assert not (tour.folder / ".holedger" / "gateway.toml").exists()
    assert "GatewayCall" in out


def test_tour_own_task(tour: TourState) -> None:
    block = next(b for b in tour_blocks() if "pin_task" in b.body)
    code, out = _run(tour, block)
    assert code == 0, out[-3000:]
    assert "verify exit status: 1" in out  # the changed copy fails before re-pinning
    assert "all" in out and "digests verified" in out
    assert (tour.folder / "mytask" / "task.toml").read_text().count('id = "mytask"') == 1


def test_tour_third_party_bundle(tour: TourState) -> None:
    block = next(b for b in tour_blocks() if "holedger export" in b.body)
    code, out = _run(tour, block)
    assert code == 0, out[-3000:]
    assert "VERIFIED" in out
    assert (tour.folder / "run.hlb").stat().st_size > 0
    statement = json.loads((tour.folder / "result.intoto.json").read_text())
    assert "payload" in statement and statement["signatures"]
    # "everything 'holedger replay' checks, from the file alone": the candidates' history
    # travels in the bundle, so the leakage check scans the candidates there too.
    proc = run_blocks(
        [
            _prelude(tour),
            Block(0, "holedger verify run.hlb --json > verified.json || true\n", False),
        ],
        tour.folder,
    )
    assert proc.returncode == 0
    checks = json.loads((tour.folder / "verified.json").read_text())["checks"]
    scan = next(c for c in checks if c["name"] == "candidate_scan")
    assert scan["ok"] and "skipped" not in scan["detail"], scan


def test_tour_blocks_are_all_covered() -> None:
    """Each shell block of the tour is run by one of the tests above."""
    bodies = [b.body for b in tour_blocks()]
    assert "holedger demo --json" in bodies[0]
    assert "holedger replay" in bodies[1]
    assert "UPDATE holedger_events" in bodies[2] and "UPDATE holedger_events" in bodies[3]
    assert any("postgresql+psycopg" in b for b in bodies)
    assert any("sim serve" in b for b in bodies)
    assert any("pin_task" in b for b in bodies)
    assert any("holedger export" in b for b in bodies)
    assert Path(__file__).read_text().count("def test_tour_") >= 7
