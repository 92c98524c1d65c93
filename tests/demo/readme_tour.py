"""The README's tour, as the tests run it: its shell blocks, in order, in one folder."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
TOUR_START = "## A tour, command by command"
TOUR_END = "## What the optimizer sees"
SLOW_MARK = "<!-- tour: slow -->"
BLOCK = re.compile(r"(?P<mark><!-- tour: slow -->\n)?```sh\n(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    index: int
    body: str
    slow: bool


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def tour_blocks() -> list[Block]:
    text = readme_text()
    tour = text[text.index(TOUR_START) : text.index(TOUR_END)]
    return [
        Block(i, m.group("body"), bool(m.group("mark"))) for i, m in enumerate(BLOCK.finditer(tour))
    ]


def fenced_commands() -> list[str]:
    """Every line of every fenced shell block in the README (the first two commands too)."""
    text = readme_text()
    lines: list[str] = []
    for m in re.finditer(r"```(?:sh)?\n(.*?)```", text, re.S):
        lines += [ln.strip() for ln in m.group(1).splitlines() if ln.strip()]
    return lines


def run_blocks(
    blocks: list[Block], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run the blocks as one bash script (variables carry over), stopping at the first
    failing command; returns the finished process."""
    # Background jobs a block starts (a stand-in upstream) end with the script.
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
    script += "\n".join(b.body for b in blocks)
    run_env = {**os.environ, **(env or {})}
    run_env.pop("HOLEDGER_HOME", None)
    run_env.pop("HOLEDGER_LEDGER", None)
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
