"""Cross-run statistics from the ledger: normalized gains against resolution bands.

For every scored run: E(H+), the pinned E(H0), g = (E(H+) - E(H0)) / (1 - E(H0)), the
task's resolution band and whether g clears it, and the share of each search-budget
component the optimizer used. Grouped by (task, task digest, optimizer), so versions of
a task are never pooled: run count, mean, min and max g (exact rationals, with floats
beside them for plotting), and the fraction of runs whose g clears the band. Everything
is read from signed events, of a ledger or of run bundles (optionally only from runs that
replay verifies); nothing is re-executed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from holedger.analysis.bands import indistinguishable_from_zero
from holedger.ledger.keys import PublicKey
from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.protocol.rules import BASELINE_OPTIMIZER, add_use, no_use
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import EvaluationRequested, RunOpened, RunScored


@dataclass(frozen=True)
class RunGain:
    run_id: str
    task_id: str
    task_digest: str
    optimizer: str
    e_h_plus: Fraction
    e_h0: Fraction
    g: Fraction | None
    band: Fraction
    budget_used: dict[str, Fraction]
    verified: bool | None = None
    models: tuple[str, ...] = ()  # the target models the run's task pins
    baseline_run_id: str | None = None  # the seed-baseline run its E(H0) is pinned to

    @property
    def versus_zero(self) -> str | None:
        """g judged by the band's two-sided rule (A5): ``gain`` (g > b) or ``loss``
        (g < -b) when resolved from 0, ``within band`` when |g| <= b; None without g."""
        if self.g is None:
            return None
        if indistinguishable_from_zero(self.g, self.band):
            return "within band"
        return "gain" if self.g > 0 else "loss"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "task_id": self.task_id,
            "task_digest": self.task_digest,
            "optimizer": self.optimizer,
            "models": list(self.models),
            "baseline_run_id": self.baseline_run_id,
            # quantities as Fractions: --json gives each as q and q_exact (holedger.numbers)
            "e_h_plus": self.e_h_plus,
            "e_h0": self.e_h0,
            "g": self.g,
            "resolution_band": self.band,
            "versus_zero": self.versus_zero,
            "budget_used": {k: float(v) for k, v in self.budget_used.items()},
            "budget_used_exact": {k: rational_to_str(v) for k, v in self.budget_used.items()},
            "verified": self.verified,
        }


@dataclass
class GroupSummary:
    task_id: str
    task_digest: str
    optimizer: str
    gains: list[Fraction] = field(default_factory=list)
    resolved_gains: int = 0
    resolved_losses: int = 0
    undefined: int = 0

    def to_json(self) -> dict[str, Any]:
        n = len(self.gains)
        mean = sum(self.gains, Fraction(0)) / n if n else None
        low, high = (min(self.gains), max(self.gains)) if n else (None, None)
        return {
            "task_id": self.task_id,
            "task_digest": self.task_digest,
            "optimizer": self.optimizer,
            "runs": n + self.undefined,
            "mean_g": None if mean is None else float(mean),
            "min_g": None if low is None else float(low),
            "max_g": None if high is None else float(high),
            "mean_g_exact": None if mean is None else rational_to_str(mean),
            "min_g_exact": None if low is None else rational_to_str(low),
            "max_g_exact": None if high is None else rational_to_str(high),
            "resolved_gains": self.resolved_gains,
            "resolved_losses": self.resolved_losses,
            "within_band": n - self.resolved_gains - self.resolved_losses,
        }


def run_gain(ledger: Ledger, run_id: str) -> RunGain | None:
    """The gain of one run, or None when the run was never scored."""
    return gain_of(run_id, ledger.records(run_id))


def gain_of(
    run_id: str, records: Iterable[Record], aborted: list[str] | None = None
) -> RunGain | None:
    """The gain of a run from its records (a ledger's or a bundle's), None if unscored, not
    closed (RunScored without the RunClosed that follows it: a truncated log), aborted
    (closed by ``holedger run abort``: its id is appended to ``aborted`` when given), or an
    audit's control run (``RunOpened.control_of``: no optimizer searched in it)."""
    opened: RunOpened | None = None
    scored: RunScored | None = None
    closed = False
    reason = None
    used = no_use()
    for rec in records:
        if rec.type == "RunOpened":
            payload = rec.typed_payload()
            assert isinstance(payload, RunOpened)
            opened = payload
        elif rec.type == "EvaluationRequested":
            req = rec.typed_payload()
            assert isinstance(req, EvaluationRequested)
            if req.decision == "accepted" and req.split in ("dev", "val"):
                used = add_use(used, req.split, req.cost)
        elif rec.type == "RunScored":
            payload = rec.typed_payload()
            assert isinstance(payload, RunScored)
            scored = payload
        elif rec.type == "RunClosed":
            closed = True
            reason = rec.payload.get("reason")
    if closed and reason == "aborted":
        if aborted is not None and not (
            opened is not None and opened.optimizer == BASELINE_OPTIMIZER
        ):
            aborted.append(run_id)
        return None
    if opened is None or scored is None or not closed:
        return None  # unscored, or a log cut before its end (a bundle's, say)
    if opened.control_of is not None:
        return None  # an audit's control run: no optimizer's search, in no analysis
    budget = opened.terms.budget
    shares: dict[str, Fraction] = {}
    for split, limit, use in (("dev", budget.dev, used.dev), ("val", budget.val, used.val)):
        if limit.calls:
            shares[f"{split}_calls"] = Fraction(use.calls, limit.calls)
        if limit.case_passes:
            shares[f"{split}_case_passes"] = use.case_passes / limit.case_passes
    return RunGain(
        run_id=run_id,
        task_id=opened.task_id,
        task_digest=opened.task_digest,
        optimizer=opened.optimizer,
        e_h_plus=scored.e_h_plus,
        e_h0=scored.e_h0,
        g=scored.g,
        band=opened.terms.resolution_band,
        budget_used=shares,
        models=tuple(opened.terms.models),
        baseline_run_id=(
            opened.seed_baseline.baseline_run_id if opened.seed_baseline is not None else None
        ),
    )


# Reads a run's records into its gain: (run id, records, ids of aborted runs) -> gain;
# a richer reader than gain_of returns a subclass of RunGain.
Extract = Callable[[str, Iterable[Record], "list[str] | None"], "RunGain | None"]


def collect(
    ledger: Ledger,
    *,
    task_id: str | None = None,
    include_baselines: bool = False,
    verify: bool = False,
    excluded: list[str] | None = None,
    trusted_keys: Sequence[PublicKey] = (),
    aborted: list[str] | None = None,
    extract: Extract = gain_of,
) -> list[RunGain]:
    """Every scored run's gain, optionally only runs that replay verifies (with
    ``trusted_keys`` pinned, if given; the ids of the scored runs that do not verify are
    appended to ``excluded`` when it is given). Aborted runs have no score to count: their
    ids are appended to ``aborted`` when it is given."""
    from holedger.replay.inputs import CheckInputs
    from holedger.replay.runs import LedgerBaselines

    # One source for every run: a task's baseline run is replayed once, not once per run.
    inputs = CheckInputs(baselines=LedgerBaselines(ledger, trusted_keys))
    gains = []
    for info in ledger.runs():
        if task_id and info.task_id != task_id:
            continue
        if info.optimizer == BASELINE_OPTIMIZER and not include_baselines:
            continue
        if info.state == "aborted" and aborted is not None:
            aborted.append(info.run_id)
        if info.state != "closed":
            continue
        gain = extract(info.run_id, ledger.records(info.run_id), None)
        if gain is None:
            continue

        def replayed(run_id: str = info.run_id) -> bool:
            from holedger.replay.runs import replay_run

            return replay_run(ledger, run_id, trusted_keys=trusted_keys, inputs=inputs).verified

        kept = _kept(gain, include_baselines, replayed if verify else None, excluded)
        if kept is not None:
            gains.append(kept)
    return gains


def gather(
    *,
    ledger: Ledger | None,
    bundles: Sequence[str],
    task_id: str | None,
    verify: bool,
    trusted_keys: Sequence[PublicKey],
    excluded: list[str],
    no_baseline: list[str],
    aborted: list[str] | None = None,
    include_baselines: bool = False,
    extract: Extract = gain_of,
    wanted: frozenset[str] | None = None,
) -> list[RunGain]:
    """The runs of the analyses' one source: the ``bundles`` when any are given
    (:func:`collect_bundles`), else the ``ledger`` (:func:`collect`)."""
    common: dict[str, Any] = {
        "task_id": task_id,
        "include_baselines": include_baselines,
        "verify": verify,
        "excluded": excluded,
        "trusted_keys": trusted_keys,
        "aborted": aborted,
        "extract": extract,
    }
    if bundles:
        return collect_bundles(list(bundles), no_baseline=no_baseline, wanted=wanted, **common)
    assert ledger is not None, "no bundles: a ledger is the source"
    return collect(ledger, **common)


def collect_bundles(
    paths: Sequence[str],
    *,
    task_id: str | None = None,
    include_baselines: bool = False,
    verify: bool = False,
    excluded: list[str] | None = None,
    trusted_keys: Sequence[PublicKey] = (),
    no_baseline: list[str] | None = None,
    aborted: list[str] | None = None,
    extract: Extract = gain_of,
    wanted: frozenset[str] | None = None,
) -> list[RunGain]:
    """As :func:`collect`, from run bundles (``holedger export``) instead of a ledger.
    ``wanted``: the event types ``extract`` reads; other records are not parsed (their
    type is the last member of the signed envelope, so it is read off the record's end).

    A run counts once, however many bundles of it are given. With ``verify``, the first of
    its bundles that verifies counts (so the order of the files does not decide), and a
    run pinned to a seed-baseline run is verified together with that run's bundle, which
    must be among ``paths`` (as ``verify --baseline``): a run whose E(H0) cannot be
    checked is left out, its id appended to ``no_baseline`` (and not to ``excluded``).
    """
    from holedger.bundles.format import open_bundle
    from holedger.bundles.verify import BundleBaselines, verify_bundle
    from holedger.errors import BundleError
    from holedger.ledger.fastpath import parse_record

    by_run: dict[str, list[str]] = {}  # every bundle of a run, in the order given
    scored: dict[str, list[tuple[str, RunGain]]] = {}  # those that hold its score
    for path in paths:
        cut: list[str] = []
        try:
            with open_bundle(path) as bundle:
                run_id = bundle.run_id
                records = (
                    parse_record(raw)
                    for raw in bundle.records()
                    if wanted is None or _wanted(raw, wanted)
                )
                gain = extract(run_id, records, cut)
        except BundleError as exc:  # name the file: many are given
            raise BundleError(f"{path}: {exc}", hint=exc.hint) from None
        if cut and aborted is not None and run_id not in aborted:
            aborted.append(run_id)
        by_run.setdefault(run_id, []).append(path)
        if gain is not None:
            scored.setdefault(run_id, []).append((path, gain))
    # One source per baseline bundle: runs pinned to one baseline verify it once.
    sources: dict[str, BundleBaselines] = {}

    def baseline_of(path: str) -> BundleBaselines:
        if path not in sources:
            sources[path] = BundleBaselines(path, trusted_keys)
        return sources[path]

    gains = []
    for run_id, bundles in scored.items():
        gain = bundles[0][1]
        if task_id and gain.task_id != task_id:
            continue
        if not verify:
            kept = _kept(gain, include_baselines, None, excluded)
            if kept is not None:
                gains.append(kept)
            continue
        if gain.optimizer == BASELINE_OPTIMIZER and not include_baselines:
            continue
        # A run that names no baseline run is verified alone (replay decides: no pin fails,
        # a pin without a run id is a warning); one that names it, with its bundle.
        pinned = gain.baseline_run_id
        baselines: list[BundleBaselines | None] = [None]
        if pinned is not None and gain.optimizer != BASELINE_OPTIMIZER:
            if pinned not in by_run:
                if no_baseline is not None:
                    no_baseline.append(run_id)
                continue
            baselines = [baseline_of(p) for p in by_run[pinned]]
        # The first (bundle, baseline bundle) pair that verifies; that bundle's gain counts.
        for candidate, own in bundles:
            if any(
                verify_bundle(candidate, trusted_keys=trusted_keys, baseline=base).verified
                for base in baselines
            ):
                gains.append(replace(own, verified=True))
                break
        else:
            if excluded is not None:
                excluded.append(run_id)
    return gains


def _wanted(raw: bytes, wanted: frozenset[str]) -> bool:
    """Whether a record is of a wanted type, read off its end (``..."type":"T"}``); a
    record whose end is not so is parsed (and judged) anyway."""
    start = raw.rfind(b',"type":"')
    if start < 0 or not raw.endswith(b'"}'):
        return True
    return raw[start + 9 : -2].decode("ascii", "replace") in wanted


def _kept(
    gain: RunGain,
    include_baselines: bool,
    verify: Callable[[], bool] | None,
    excluded: list[str] | None,
) -> RunGain | None:
    """The gain as counted (marked verified when ``verify`` is given), or None when it is
    a baseline left out or a run that does not verify (named in ``excluded``)."""
    if gain.optimizer == BASELINE_OPTIMIZER and not include_baselines:
        return None
    if verify is None:
        return gain
    if not verify():
        if excluded is not None:
            excluded.append(gain.run_id)
        return None
    return replace(gain, verified=True)


def summarize(gains: Iterable[RunGain]) -> list[GroupSummary]:
    groups: dict[tuple[str, str, str], GroupSummary] = defaultdict(lambda: GroupSummary("", "", ""))
    for gain in gains:
        key = (gain.task_id, gain.task_digest, gain.optimizer)
        group = groups[key]
        group.task_id, group.task_digest, group.optimizer = key
        if gain.g is None:
            group.undefined += 1
            continue
        group.gains.append(gain.g)
        group.resolved_gains += gain.versus_zero == "gain"
        group.resolved_losses += gain.versus_zero == "loss"
    return [groups[key] for key in sorted(groups)]
