"""Seed variants: the same seed harness written against another provider's SDK.

A task folder may hold ``variants/NAME/``: files laid over a copy of the seed tree (the
corpus and everything else stay the seed's). officeqa-lite ships ``anthropic-sdk`` (the
Anthropic Messages API through the ``anthropic`` SDK) and ``responses-api`` (the openai
SDK's Responses API); each keeps the seed's levers and naivety, so an optimizer can start
from the SDK its harnesses are written in.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from holedger.errors import NotFoundError

VARIANTS_DIR = "variants"


def seed_variants(task_root: Path) -> list[str]:
    """The names of the task's seed variants, sorted."""
    folder = task_root / VARIANTS_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def write_variant(task_root: Path, seed_dir: Path, name: str, dest: Path) -> Path:
    """Write the seed tree with variant ``name`` laid over it into ``dest`` (new)."""
    overlay = task_root / VARIANTS_DIR / name
    if name not in seed_variants(task_root):
        raise NotFoundError(
            f"task has no seed variant {name!r}",
            hint=f"its variants: {', '.join(seed_variants(task_root)) or 'none'}",
        )
    shutil.copytree(seed_dir, dest)
    for source in sorted(overlay.rglob("*")):
        if source.is_file() and "__pycache__" not in source.parts:
            target = dest / source.relative_to(overlay)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return dest
