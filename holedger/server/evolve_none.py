"""NONE runs of solve-evolve streams: the same stream with no evolver, the seed throughout.

Base(f) of the paper is the in-situ pass rate of the agent's seed harness on the stream.
The server measures it once per task digest and stream digest by a NONE run: a
solve-evolve run of its own, optimizer label ``solve-evolve-none``, whose every step the
server closes as ``unchanged``, and whose InSituScored gives J = Base. The home remembers
it in ``<home>/baselines/none-<task digest>-<stream digest>.json``; the file is not trusted
alone: the named run must be in the ledger, of the same task and stream, with that J.
Every later solve-evolve run of the stream pins it in ``EvolveTerms.none_run``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from holedger.errors import HoledgerError
from holedger.protocol import evolve, rules
from holedger.schemas.events import EvolveTerms, NoneRun
from holedger.server.locks import nomination_lock

# ``runs`` below is the server's EvolveRuns (server/evolve.py imports this module).
EvolveRuns = Any


def none_path(runs: EvolveRuns, task_digest: str, terms: EvolveTerms) -> Path:
    name = f"none-{task_digest[:24]}-{terms.stream_digest[:24]}.json"
    home: Path = runs.service.settings.home
    return home / "baselines" / name


def ensure_none(runs: EvolveRuns, task_ref: str, terms: EvolveTerms, *, backend: str) -> NoneRun:
    """The stream's pinned NONE run: read from the home and re-checked against the ledger,
    or run now (every step scored under the seed, closed as unchanged)."""
    task = runs.service.task(task_ref)
    path = none_path(runs, task.digest, terms)
    path.parent.mkdir(parents=True, exist_ok=True)
    with nomination_lock(path.with_suffix(".lock")):
        known = _read_none(runs, task.digest, terms, path)
        if known is not None:
            return known
        plain = terms.model_copy(update={"none_run": None, "step_tokens": None})
        opened = runs.open_run(
            task_ref, plain, optimizer=evolve.NONE_OPTIMIZER, backend=backend, none=False
        )
        run_id = opened.run_id
        scored = None
        for step in range(1, terms.steps + 1):
            runs.solve(run_id)
            scored = runs.unchanged(run_id, step).finished
        assert scored is not None
        none = NoneRun(
            run_id=run_id,
            j=scored.j,
            per_case_digest=rules.per_case_digest((c.case_id, c.scores) for c in scored.per_case),
        )
        record: dict[str, object] = {
            "task_digest": task.digest,
            "stream_digest": terms.stream_digest,
        }
        record.update(none.model_dump(mode="json"))
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return none


def _read_none(
    runs: EvolveRuns, task_digest: str, terms: EvolveTerms, path: Path
) -> NoneRun | None:
    if not path.exists():
        return None
    ledger = runs.service.ledger
    try:
        data = json.loads(path.read_text())
        none = NoneRun.model_validate({k: v for k, v in data.items() if k in NoneRun.model_fields})
        if not ledger.has_run(none.run_id):
            return None
        opened = ledger.run_terms(none.run_id)
        pinned = opened.solve_evolve
        if (
            opened.task_digest != task_digest
            or pinned is None
            or pinned.stream_digest != terms.stream_digest
            or opened.optimizer != evolve.NONE_OPTIMIZER
        ):
            return None
        scored = runs.fold(none.run_id).in_situ
    except (HoledgerError, ValueError):
        return None
    if scored is None or scored.j != none.j:
        return None
    return none
