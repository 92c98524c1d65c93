"""Re-pinning a task folder after its author changed it: manifest.json and task.toml pins.

``pin_task(root)`` rebuilds the split manifest from the cases and rewrites the pinned
lines of ``task.toml`` (verifier ``digest``, ``sizes``, ``split_digests``,
``manifest_digest``, seed ``tree_digest`` and ``commit``). It is an authoring tool: a
run never re-pins, it refuses a task whose files no longer match their pins.
"""

from __future__ import annotations

import re
from pathlib import Path

from holedger.errors import UsageError
from holedger.schemas.task import SPLITS, SplitManifest
from holedger.tasks import digests
from holedger.tasks.loader import TASK_FILE, build_manifest, read_cases, read_spec, seed_commit


def manifest_text(manifest: SplitManifest) -> str:
    """The manifest file's text: sorted keys, one case per line, stable across runs."""
    import json

    data = manifest.model_dump(mode="json")
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _replace(text: str, key: str, value: str) -> str:
    pattern = re.compile(rf"^{key} = .*$", re.M)
    if len(pattern.findall(text)) != 1:
        raise UsageError(f"{TASK_FILE} must have exactly one '{key} = ...' line to re-pin")
    return pattern.sub(lambda _m: f"{key} = {value}", text)


def pin_task(root: Path) -> SplitManifest:
    """Rewrite manifest.json and the pinned lines of task.toml from the folder's files."""
    spec = read_spec(root)
    cases = {split: read_cases(root, spec, split) for split in SPLITS}
    manifest = build_manifest(spec.id, cases)
    (root / spec.splits.manifest).write_text(manifest_text(manifest), encoding="utf-8")
    seed_dir = root / spec.seed.path
    commit = seed_commit(seed_dir)
    sizes = ", ".join(f"{s} = {len(manifest.splits[s])}" for s in SPLITS)
    split_digests = ", ".join(f'{s} = "{manifest.split_digests[s]}"' for s in SPLITS)
    text = (root / TASK_FILE).read_text(encoding="utf-8")
    text = _replace(
        text, "digest", f'"{digests.sha256_hex((root / spec.verifier.path).read_bytes())}"'
    )
    text = _replace(text, "sizes", "{ " + sizes + " }")
    text = _replace(text, "split_digests", "{ " + split_digests + " }")
    text = _replace(text, "manifest_digest", f'"{manifest.manifest_digest}"')
    text = _replace(text, "tree_digest", f'"{digests.tree_digest(seed_dir)}"')
    text = _replace(text, "commit", f'"{commit}"')
    (root / TASK_FILE).write_text(text, encoding="utf-8")
    return manifest
