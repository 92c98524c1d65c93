"""Where the grid's observations come from: the home's ledger (or --ledger URL), run
bundles (verified by default), or a published results table (nothing verified).

A run enters the grid only with its signed optimizer descriptor; its keys (model,
harness, scope, family, release, replicate) never come from file names. Runs left out
are named with the reason: not verified, aborted, never scored, still open, no
descriptor, baseline of another run not given, an audit's control run (its signed
``RunOpened.control_of``: no optimizer searched in it).

The table (``--table CSV``) has one row per optimizer model and harness: columns
``model``, ``harness`` (required), ``scope`` (native|common, default common),
``family`` and ``release`` (optional), and one column of g per task (a decimal or a
fraction p/q; an empty cell is a missing cell). A task column must name a task holedger
knows (its band is the task's) or be given a band with ``--band TASK=B``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from holedger.analysis.csvtable import plain_number, read_table, table_number
from holedger.analysis.facts import FACT_TYPES, RunFacts, facts_of
from holedger.analysis.grid import Observation
from holedger.errors import UsageError
from holedger.ledger.keys import PublicKey

UNVERIFIED = "UNVERIFIED: read from a published table; nothing in it is verified"
TABLE_FIELDS = ("model", "harness", "scope", "family", "release")


@dataclass
class Source:
    """The observations of one input, the facts of each run, and what was left out."""

    origin: str  # "ledger", "bundles" or "table"
    observations: list[Observation] = field(default_factory=list)
    facts: dict[str, RunFacts] = field(default_factory=dict)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (run or row, why)
    verified: bool | None = None  # None: a table, nothing verified
    note: str = ""
    bundle_paths: list[str] = field(default_factory=list)  # where candidates' trees are
    # Every scored run read (in the grid or not), and the re-scoring runs among them.
    scored: dict[str, RunFacts] = field(default_factory=dict)
    rescorings: list[RunFacts] = field(default_factory=list)
    runs_dir: Path | None = None  # the home's candidate repositories
    # The analysed in-situ grids of the ledger's solve-evolve runs (analysis/insitu.py), for
    # the report's capability heat maps; None: not read (a table, bundles).
    in_situ: list[dict[str, Any]] | None = None
    # Folders of tasks holedger does not know by name (a campaign's copies of a task), by
    # task id, for what needs the task at hand (a task's lever rules).
    task_roots: dict[str, Path] = field(default_factory=dict)

    def readers(self) -> dict[str, Any]:
        """run id -> a reader of its candidates' files (runs whose trees are at hand)."""
        from holedger.analysis.trees import bundle_reader, repo_reader

        out: dict[str, Any] = {}
        if self.runs_dir is not None:
            for run_id in self.facts:
                reader = repo_reader(self.runs_dir / f"{run_id}.git")
                if reader is not None:
                    out[run_id] = reader
        if self.bundle_paths:
            from holedger.bundles.format import open_bundle

            for path in self.bundle_paths:
                bundle = open_bundle(path)  # kept open while the readers live
                if bundle.run_id in self.facts and bundle.run_id not in out:
                    out[bundle.run_id] = bundle_reader(bundle)
                else:
                    bundle.close()
        return out

    @property
    def first_line(self) -> str | None:
        return UNVERIFIED if self.origin == "table" else None

    def header_json(self) -> dict[str, Any]:
        return {
            "source": self.origin,
            "verified": self.verified,
            "unverified_notice": self.first_line,
            "runs_left_out": [{"run": r, "why": why} for r, why in self.left_out],
            "note": self.note,
        }


def observation_of(facts: RunFacts) -> Observation | None:
    d = facts.descriptor
    if d is None:
        return None
    return Observation(
        task=facts.task_id,
        model=d.model,
        harness=d.harness,
        scope=d.harness_scope,
        g=facts.g,
        band=facts.band,
        run_id=facts.run_id,
        replicate=d.replicate,
        family=d.family,
        release=d.release,
        e_h_plus=facts.e_h_plus,
        e_h0=facts.e_h0,
    )


def _extractor(left_out: list[tuple[str, str]]) -> Any:
    def extract(run_id: str, records: Any, aborted: list[str] | None = None) -> RunFacts | None:
        got = facts_of(run_id, records)
        if isinstance(got, str):
            left_out.append((run_id, got))
            if got.startswith("aborted") and aborted is not None:
                aborted.append(run_id)
            return None
        return got

    return extract


def from_runs(
    *,
    ledger_url: str | None = None,
    runs_dir: Path | None = None,
    bundles: Sequence[str] = (),
    task_id: str | None = None,
    verify: bool,
    trusted_keys: Sequence[PublicKey] = (),
) -> Source:
    """Read every run of the ledger (or the bundles) into a Source."""
    from holedger.analysis.gains import gather
    from holedger.ledger.store import Ledger
    from holedger.protocol.rules import BASELINE_OPTIMIZER

    left: list[tuple[str, str]] = []
    excluded: list[str] = []
    no_baseline: list[str] = []
    origin = "bundles" if bundles else "ledger"
    ledger = None
    if not bundles:
        assert ledger_url is not None
        ledger = Ledger.open(ledger_url, None, create_tables=False)
    try:
        for info in ledger.runs() if ledger is not None else ():
            if info.state != "closed" and (not task_id or info.task_id == task_id):
                if info.optimizer != BASELINE_OPTIMIZER:
                    why = "aborted" if info.state == "aborted" else f"not closed ({info.state})"
                    left.append((info.run_id, why))
        gains = gather(
            ledger=ledger,
            bundles=bundles,
            task_id=task_id,
            verify=verify,
            excluded=excluded,
            trusted_keys=trusted_keys,
            no_baseline=no_baseline,
            extract=_extractor(left),
            wanted=FACT_TYPES,
        )
    finally:
        if ledger is not None:
            ledger.close()
    see = "holedger verify BUNDLE" if bundles else "holedger replay RUN"
    left += [(r, f"replay does not verify it (see '{see}')") for r in excluded]
    left += [
        (r, "the bundle of the seed-baseline run its E(H0) is pinned to was not given")
        for r in no_baseline
    ]
    source = Source(origin, verified=verify, bundle_paths=list(bundles), runs_dir=runs_dir)
    for gain in gains:
        assert isinstance(gain, RunFacts)
        source.scored[gain.run_id] = gain
        if gain.rescore_of is not None:  # a re-scoring of another run's nominee
            source.rescorings.append(gain)
            continue
        obs = observation_of(gain)
        if obs is None:
            left.append(
                (
                    gain.run_id,
                    f"no optimizer descriptor (opened with the label {gain.optimizer!r} only)",
                )
            )
            continue
        source.facts[gain.run_id] = gain
        source.observations.append(obs)
    source.left_out = sorted(left)
    source.note = (
        "every run counted verifies"
        if verify
        else "not replayed: --verify counts only runs that verify"
    )
    return source


def parse_bands(values: Sequence[str]) -> dict[str, Fraction]:
    """``--band TASK=B`` options."""
    bands: dict[str, Fraction] = {}
    for value in values:
        task, sep, text = value.partition("=")
        band = plain_number(text.strip())
        if band is None or not sep or not task.strip() or not 0 <= band <= 1:
            raise UsageError(
                f"--band {value!r} is not TASK=B with B a number in [0, 1]",
                hint="e.g. --band officeqa=0.045 (a band is in units of g, as a task's is)",
            )
        bands[task.strip()] = band
    return bands


def known_task_root(task: str) -> Path | None:
    """The folder of a task holedger knows, else None."""
    from holedger.tasks import load_task

    try:
        return Path(load_task(task).root)
    except Exception:  # any failure to load: the task is not one holedger knows
        return None


def known_task_band(task: str) -> Fraction | None:
    """The band of a task holedger knows (bundled or installed), else None."""
    from holedger.tasks import load_task

    try:
        return load_task(task).terms().resolution_band
    except Exception:  # any failure to load: the task is not one holedger knows
        return None


def from_table(path: str, bands: dict[str, Fraction]) -> Source:
    """Read a results table; a UsageError naming the row and column for bad input."""
    name, header, rows = read_table(
        path,
        ("model", "harness"),
        "columns: model, harness, [scope, family, release,] one per task",
    )
    tasks = [h for h in header if h not in TABLE_FIELDS]
    if not tasks:
        raise UsageError(f"table {name}: no task column", hint="add one column of g per task")
    task_band: dict[str, Fraction] = {}
    for col, task in enumerate(header, start=1):
        if task not in tasks:
            continue
        band = bands.get(task)
        if band is None:
            band = known_task_band(task)
        if band is None:
            raise UsageError(
                f"table {name}: column {col} names an unknown task {task!r}",
                hint=f"give its resolution band with --band {task}=B",
            )
        task_band[task] = band
    source = Source("table", verified=None, note=UNVERIFIED)
    seen: dict[tuple[str, str], int] = {}
    for line, cells in rows:
        model, harness = cells["model"], cells["harness"]
        if not model or not harness:
            raise UsageError(
                f"table {name} row {line}: empty model or harness",
                hint="every row names its optimizer model and harness",
            )
        if (model, harness) in seen:
            raise UsageError(
                f"table {name} row {line}: duplicate row for model {model!r} and harness "
                f"{harness!r} (first at row {seen[model, harness]})",
                hint="one row per model and harness; replicates are averaged before a table",
            )
        seen[model, harness] = line
        scope = cells.get("scope") or "common"
        if scope not in ("native", "common"):
            raise UsageError(
                f"table {name} row {line}: scope {scope!r} is not native or common",
                hint="scope is native (the model's own harness) or common (empty: common)",
            )
        family, release = cells.get("family") or None, cells.get("release") or None
        _check_row(name, line, model, harness, scope, family, release)
        for task in tasks:
            text = cells[task]
            if not text:
                continue
            source.observations.append(
                Observation(
                    task=task,
                    model=model,
                    harness=harness,
                    scope=scope,
                    g=_table_gain(name, line, task, text),
                    band=task_band[task],
                    family=family,
                    release=release,
                )
            )
    return source


# No normalized gain is above 1 (E(H+) <= 1); far below -1 is possible only as E(H0)
# nears 1, and a value past this one is a typing error, not a measurement.
_LOWEST_GAIN = Fraction(-(10**6))


def _table_gain(name: str, line: int, task: str, text: str) -> Fraction:
    g = table_number(name, line, task, text)
    if g > 1:
        raise UsageError(
            f"table {name} row {line}, column {task!r}: {text} is above 1, the largest "
            "normalized gain",
            hint="g = (E(H+) - E(H0)) / (1 - E(H0)); give a percentage divided by 100",
        )
    if g < _LOWEST_GAIN:
        raise UsageError(
            f"table {name} row {line}, column {task!r}: {text} is not a plausible "
            "normalized gain (below -1000000)",
            hint="g = (E(H+) - E(H0)) / (1 - E(H0))",
        )
    return g


def _check_row(
    name: str,
    line: int,
    model: str,
    harness: str,
    scope: str,
    family: str | None,
    release: str | None,
) -> None:
    """A row's keys follow the rules of a signed optimizer descriptor (a release is an
    ordinal or an ISO date, as the ladder orders them; no control characters)."""
    from pydantic import ValidationError

    from holedger.schemas.events import OptimizerDescriptor

    try:
        OptimizerDescriptor(
            model=model, harness=harness, harness_scope=scope, family=family, release=release
        )
    except ValidationError as exc:
        column = str(exc.errors()[0]["loc"][0])
        value = {"model": model, "harness": harness, "family": family, "release": release}
        raise UsageError(
            f"table {name} row {line}, column {column!r}: {value.get(column)!r} is not "
            "allowed there",
            hint="a release is an ordinal (3) or an ISO date (2026-05-01); names have no "
            "control characters and at most 200 characters",
        ) from None
