"""The task spec (``task.toml``) and the split manifest (``manifest.json``).

A task folder holds ``task.toml`` (a :class:`TaskSpec`), the verifier source, the split
manifest, the cases (``cases/<split>.json``, with expected answers: trusted process only)
and the seed harness folder. Digests are defined in docs/FORMAT.md, "Task and manifest
digests", and computed by :mod:`holedger.tasks.digests`.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import (
    BudgetVector,
    DisclosurePolicy,
    Model,
    ServerToolName,
    SplitBudget,
    TaskTerms,
)
from holedger.schemas.types import Rational, Sha256Hex, Split

SPLITS: tuple[Split, ...] = ("dev", "val", "test")
MANIFEST_FORMAT: Literal["holedger-split-manifest/1"] = "holedger-split-manifest/1"
DEFAULT_MODEL = "holedger-sim-1"
TASK_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


def default_budget() -> BudgetVector:
    """HarnessOpt-Bench defaults: 100 calls and 4 case-passes per search split."""
    return BudgetVector(
        dev=SplitBudget(calls=100, case_passes=Fraction(4)),
        val=SplitBudget(calls=100, case_passes=Fraction(4)),
        target_tokens=2_000_000,
    )


class Environment(Model):
    """The sandbox environment a trial runs in: pinned as part of the task digest."""

    runtime: str = "python3"
    python: str = "3.11"
    packages: list[str] = Field(default_factory=lambda: ["openai>=1.30"])
    image: str | None = None
    network: Literal["gateway-only"] = "gateway-only"
    env: dict[str, str] = Field(default_factory=dict)


class VerifierRef(Model):
    """An importable scoring function, by file and name, with its source digest pinned."""

    path: str = "verifier.py"
    function: str = "score"
    digest: Sha256Hex


class SplitsRef(Model):
    """Where the cases and the manifest are, and their pinned digests and sizes."""

    cases_dir: str = "cases"
    manifest: str = "manifest.json"
    sizes: dict[Split, int]
    split_digests: dict[Split, Sha256Hex]
    manifest_digest: Sha256Hex

    @field_validator("sizes", "split_digests")
    @classmethod
    def _all_splits(cls, value: dict[str, Any]) -> dict[str, Any]:
        if set(value) != set(SPLITS):
            raise ValueError("must name exactly the splits dev, val and test")
        return value


class SeedRef(Model):
    """The seed harness folder, its tree digest and its git commit id as the server makes it."""

    path: str = "seed"
    tree_digest: Sha256Hex
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")


class TaskSpec(Model):
    """One task: everything a run pins about it (the whole spec is hashed)."""

    id: str = Field(pattern=TASK_ID_PATTERN)
    title: str = ""
    models: list[str] = Field(default_factory=lambda: [DEFAULT_MODEL], min_length=1)
    environment: Environment = Environment()
    verifier: VerifierRef
    splits: SplitsRef
    seed: SeedRef
    entrypoint: list[str] = Field(
        default_factory=lambda: ["python3", "-m", "harness"], min_length=1
    )
    immutable_paths: list[str] = Field(default_factory=list)
    budget: BudgetVector = Field(default_factory=default_budget)
    disclosure: DisclosurePolicy = DisclosurePolicy()
    case_timeout_s: int = Field(default=60, ge=1)
    # A trial killed at its time limit scores 0 ("zero", A3) unless the task says its
    # answer is scored like any other ("verifier"); left out of the spec (and so of its
    # digest) when it is the default.
    timeout_score: Literal["zero", "verifier"] = Field(
        default="zero", exclude_if=lambda v: v == "zero"
    )
    k: int = Field(default=3, ge=1)
    resolution_band: Rational = Fraction(1, 20)
    # Server-side tools (and "model_switch") the gateway lets the task's model calls use
    # (TaskTerms.server_tools); left out of the spec, and so of its digest, when none.
    server_tools: list[ServerToolName] = Field(default_factory=list, exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _sane(self) -> TaskSpec:
        if len(set(self.models)) != len(self.models) or any("*" in m for m in self.models):
            raise ValueError("models must be distinct exact ids (no wildcards)")
        if not 0 <= self.resolution_band <= 1:
            raise ValueError("resolution_band must be in [0, 1]")
        return self

    def environment_digest(self) -> str:
        """SHA-256 of the canonical JSON of the environment table."""
        data = canonical_json(self.environment.model_dump(mode="json"))
        return hashlib.sha256(data).hexdigest()

    def terms(self) -> TaskTerms:
        """What a run pins in RunOpened about this task."""
        return TaskTerms(
            task_id=self.id,
            models=list(self.models),
            split_sizes=dict(self.splits.sizes),
            split_digests=dict(self.splits.split_digests),
            manifest_digest=self.splits.manifest_digest,
            budget=self.budget,
            disclosure=self.disclosure,
            k=self.k,
            resolution_band=self.resolution_band,
            verifier_digest=self.verifier.digest,
            seed_commit=self.seed.commit,
            entrypoint=list(self.entrypoint),
            immutable_paths=list(self.immutable_paths),
            case_timeout_s=self.case_timeout_s,
            timeout_score=self.timeout_score,
            environment_digest=self.environment_digest(),
            server_tools=sorted(set(self.server_tools)) or None,
        )


class ManifestCase(Model):
    id: str = Field(min_length=1)
    digest: Sha256Hex


class SplitManifest(Model):
    """Case ids per split with per-case digests, the split digests and the manifest digest."""

    format: Literal["holedger-split-manifest/1"] = MANIFEST_FORMAT
    task_id: str
    splits: dict[Split, list[ManifestCase]]
    split_digests: dict[Split, Sha256Hex]
    manifest_digest: Sha256Hex
    source: dict[str, Any] = Field(default_factory=dict)

    def ids(self, split: Split) -> list[str]:
        return [case.id for case in self.splits[split]]
