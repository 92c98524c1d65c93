"""The parts that several event payloads share: keys, budgets, task terms, scores, usage.

``holedger.schemas.events`` re-exports every name, so callers import them from there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from holedger.schemas.model import Model
from holedger.schemas.types import (
    Count,
    ExactInt,
    KeyIdHex,
    PositiveCount,
    Rational,
    Sha256Hex,
    Split,
)


class PublicKeyInfo(Model):
    """A public key as declared in RunOpened: C2SP signed-note name, key id, raw key."""

    name: str = Field(min_length=1)
    key_id: KeyIdHex
    public_key: str = Field(description="standard base64 of the 32-byte Ed25519 public key")


class SplitBudget(Model):
    calls: Count
    case_passes: Rational


class BudgetVector(Model):
    """The search budget: per search split calls and case-passes, and target tokens."""

    dev: SplitBudget
    val: SplitBudget
    target_tokens: Count
    per_trial_tokens: Count | None = None
    # The optimizer scope's token cap; absent (not even null) when the task names none:
    # the gateway then applies its documented default (gateway.optimizer_budget).
    optimizer_tokens: Count | None = Field(default=None, exclude_if=lambda v: v is None)


class DisclosurePolicy(Model):
    dev: Literal["per_case"] = "per_case"
    val: Literal["aggregate"] = "aggregate"
    test: Literal["none"] = "none"
    min_aggregate_cases: PositiveCount = 5


ServerToolName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class TaskTerms(Model):
    """What replay needs of the task to re-derive every decision, pinned in RunOpened."""

    task_id: str
    models: list[str]
    split_sizes: dict[Split, Count]
    split_digests: dict[Split, Sha256Hex]
    manifest_digest: Sha256Hex
    budget: BudgetVector
    disclosure: DisclosurePolicy
    k: PositiveCount
    resolution_band: Rational
    verifier_digest: Sha256Hex
    seed_commit: str
    entrypoint: list[str]
    immutable_paths: list[str]
    case_timeout_s: PositiveCount
    environment_digest: Sha256Hex
    # How a timed-out trial scores (rules.trial_score): "zero" or "verifier"; absent in
    # logs written before the rule was recorded, whose timeouts replay does not judge.
    timeout_score: Literal["zero", "verifier"] | None = Field(
        default=None, exclude_if=lambda v: v is None
    )
    # What a run's model calls may reach beyond the model: server-side tools by the name
    # the gateway gives them ("web_search", "code_execution", "mcp", ...) and
    # "model_switch" (fields naming fallback models, each still in ``models``); absent
    # (not even null) when the task allows none, as in every log written before it.
    server_tools: list[ServerToolName] | None = Field(default=None, exclude_if=lambda v: v is None)
    # The seed variant (the task's variants/NAME laid over its seed) this run starts
    # from; ``seed_commit`` is then that tree's commit. Absent for the task's own seed.
    seed_variant: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", exclude_if=lambda v: v is None
    )


class RoundError(Model):
    """A K-attempt score's error bar (A3): its K round means (round r = attempt r of every
    test case) and their standard error sd(round means, n - 1) / sqrt(K), a decimal
    rounded half-even to 9 places (``rules.round_error``); ``se`` is None for K = 1."""

    round_means: list[Rational]
    se: str | None = Field(pattern=r"^[0-9]+\.[0-9]{9}$")


class SeedBaseline(Model):
    """The task's pinned E(H0): computed once with the same K, itself recorded in a ledger."""

    e_h0: Rational
    k: PositiveCount
    baseline_run_id: str | None = None
    per_case_digest: Sha256Hex | None = None
    # E(H0)'s error bar from the baseline run's per-case scores (rules.round_error);
    # absent in pins made before it was pinned.
    e_h0_error: RoundError | None = Field(default=None, exclude_if=lambda v: v is None)


class SplitUse(Model):
    calls: Count
    case_passes: Rational


class BudgetUse(Model):
    dev: SplitUse
    val: SplitUse


class CaseCost(Model):
    calls: ExactInt
    case_passes: Rational


class TokenUsage(Model):
    """OpenAI wire convention: input includes cached, output includes reasoning.

    ``cached`` counts cache reads and ``cache_write`` cache writes (as Anthropic reports
    them), both within ``input``; events written before ``cache_write`` existed lack it.
    """

    input: Count = 0
    cached: Count = 0
    cache_write: Count = 0
    output: Count = 0
    reasoning: Count = 0
    total: Count = 0
