"""The event envelope and every event type's payload (schema version 1).

The envelope is the same for every event and is what gets signed (docs/FORMAT.md);
payloads are typed per event type. ``EVENT_TYPES`` maps each type name to its payload
model: an event whose type is not in it, or whose ``schema_version`` is not
``SCHEMA_VERSION``, fails verification.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from holedger.schemas.model import RUN_ID_PATTERN, TIME_PATTERN, Model
from holedger.schemas.parts import (
    BudgetUse,
    BudgetVector,
    CaseCost,
    DisclosurePolicy,
    PublicKeyInfo,
    RoundError,
    SeedBaseline,
    ServerToolName,
    SplitBudget,
    SplitUse,
    TaskTerms,
    TokenUsage,
)
from holedger.schemas.types import (
    Count,
    ExactInt,
    KeyIdHex,
    PositiveCount,
    Rational,
    Role,
    SearchSplit,
    Sha256Hex,
    Split,
)

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------- envelope


class EventEnvelope(Model):
    """Everything of an event that is signed: the canonical JSON of this object."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    seq: Count
    type: str
    schema_version: ExactInt
    time: str = Field(pattern=TIME_PATTERN)
    role: Role
    key_id: KeyIdHex
    prev_hash: Sha256Hex
    payload: dict[str, Any]


class SignedEvent(EventEnvelope):
    """An envelope plus its Ed25519 signature (standard base64, 64 bytes)."""

    sig: str


# --------------------------------------------------------------------------- payloads


class OptimizerDescriptor(Model):
    """Who ran the search, as signed fields: the keys of every cross-run grid.

    ``release`` orders one family's releases for the release ladder: an ordinal ("3") or
    an ISO date ("2026-05-01"); ordinals sort by number, dates by date.
    ``harness_scope`` is ``native`` (the model's own coding harness) or ``common`` (a
    harness shared by every model of the grid).
    """

    model: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    family: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$"
    )
    release: str | None = Field(
        default=None, pattern=r"^(?:[0-9]{1,9}|[0-9]{4}-[0-9]{2}-[0-9]{2})$"
    )
    harness: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    harness_scope: Literal["native", "common"]
    replicate: PositiveCount = 1


class NoneRun(Model):
    """A solve-evolve run's pinned NONE run: the same stream with no evolver (the seed
    throughout), run once per task and stream, and its in-situ pass rate Base(f)."""

    run_id: str
    j: Rational
    per_case_digest: Sha256Hex


class EvolveTerms(Model):
    """What a solve-evolve run pins at its opening (docs/PROTOCOL.md, Solve-evolve runs):
    the ordered case stream (exactly ``steps`` x ``batch`` case ids of ``split``) and its
    digest, the batch size, the number of steps, the editable scope (folders of the
    harness the evolver may change) and the evolver's token budget per step."""

    split: Literal["dev"] = "dev"
    stream: list[str]
    stream_digest: Sha256Hex
    batch: PositiveCount
    steps: PositiveCount
    scope: list[str]
    step_tokens: Count | None = Field(default=None, exclude_if=lambda v: v is None)
    none_run: NoneRun | None = Field(default=None, exclude_if=lambda v: v is None)


class RescoreOf(Model):
    """What a re-scoring run (``holedger rescore``) scores again: the nominee of a closed
    run, by its commit and git tree, on the test split, outside that run's budget.
    ``index`` is which of that run's re-scorings this one is (1, 2, ...)."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    candidate: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: str = Field(pattern=r"^[0-9a-f]{40}$")
    index: PositiveCount


class ControlOf(Model):
    """What an audit's control run evaluates for: the audit and the closed run it audits
    (docs/AUDITS.md, "Control evaluations"). The server sets it when it opens the control
    run; the audited run's AuditControlEvaluated events name the control run back."""

    audit_id: str = Field(pattern=RUN_ID_PATTERN)
    run_id: str = Field(pattern=RUN_ID_PATTERN)


class RunOpened(Model):
    task_id: str
    task_digest: Sha256Hex
    terms: TaskTerms
    seed_baseline: SeedBaseline | None = None
    optimizer: str = "unnamed"
    descriptor: OptimizerDescriptor | None = None
    # A re-scoring run's binding to the run whose nominee it scores again; absent in
    # every other run.
    rescore_of: RescoreOf | None = Field(default=None, exclude_if=lambda v: v is None)
    # An audit's control run's binding to the audit and the run it audits; absent in
    # every other run (and in control runs opened before the field: their label names them).
    control_of: ControlOf | None = Field(default=None, exclude_if=lambda v: v is None)
    keys: dict[Role, PublicKeyInfo]
    origin: str
    checkpoint_interval: PositiveCount
    # Only in a solve-evolve run (absent, not null, in every other run's RunOpened).
    solve_evolve: EvolveTerms | None = Field(default=None, exclude_if=lambda v: v is None)

    @field_validator("keys")
    @classmethod
    def _server_key_declared(cls, value: dict[str, PublicKeyInfo]) -> dict[str, PublicKeyInfo]:
        if "server" not in value:
            raise ValueError("RunOpened must declare the server key")
        return value


class CandidateCommitted(Model):
    candidate: str = Field(description="the git commit id of the candidate")
    index: Count
    tree: str
    parent: str | None
    changed_paths: list[str]
    immutable_ok: bool
    immutable_violations: list[str] = []  # noqa: RUF012 (a pydantic field, copied per instance)


class EvaluationRequested(Model):
    request_id: str
    candidate: str
    split: Split
    case_ids: list[str]
    attempts: PositiveCount
    cost: CaseCost
    budget_before: BudgetUse
    decision: Literal["accepted", "rejected"]
    reason: str | None = None
    # The refusal's stable code (holedger.protocol.refusals); absent in logs written
    # before codes were recorded, where replay reads it off ``reason``.
    code: str | None = None


class TrialCompleted(Model):
    request_id: str
    trial_id: str
    candidate: str
    split: Split
    case_id: str
    attempt: Count
    backend: str
    isolation: Literal["isolated", "none"]
    limits: dict[str, ExactInt]
    exit_status: ExactInt | None
    timed_out: bool
    oom: bool
    wall_ms: Count
    cpu_ms: ExactInt | None = None
    answer_digest: Sha256Hex | None
    output_digest: Sha256Hex | None
    trace_digest: Sha256Hex | None
    score: Rational
    tokens: TokenUsage
    gateway_calls: Count
    # The id of the machine (a Ray node) that ran the trial; None on the server's own
    # machine, and absent in logs written before executors other than the local one.
    node: str | None = None


class GatewayBudgetState(Model):
    """The target-token budget as one gateway decision saw it (for replay to re-check).

    ``settled_calls`` and ``reservations`` are how many target-scope calls of the run had
    been settled and reserved when the decision was taken; ``settled`` and ``outstanding``
    (and their per-trial parts) are the token sums those counts imply.
    """

    cap: Count
    settled: Count
    outstanding: Count
    settled_calls: Count
    reservations: Count
    trial_cap: Count | None = None
    trial_settled: Count = 0
    trial_outstanding: Count = 0


class PresentedToken(Model):
    """The claims of a token refused where it was presented (a smuggled or dead token)."""

    run_id: str
    scope: Literal["target", "optimizer"]
    trial_id: str | None = None
    state: Literal["live", "expired", "revoked"]


class GatewayCall(Model):
    call_id: str
    scope: Literal["target", "optimizer"]
    request_id: str | None = None
    trial_id: str | None = None
    case_id: str | None = None
    attempt: ExactInt | None = None
    model_requested: str | None
    model_served: str | None
    allowed: bool
    reason: str | None = None
    status: ExactInt
    stream: bool = False
    tokens: TokenUsage
    reserved: Count
    max_tokens_imposed: ExactInt | None = None
    usage_estimated: bool = False
    latency_ms: Count
    request_digest: Sha256Hex | None
    response_digest: Sha256Hex | None
    endpoint: str = "/v1/chat/completions"
    code: str | None = None
    model_reported: str | None = None
    reservation_index: Count | None = None
    budget: GatewayBudgetState | None = None
    presented: PresentedToken | None = None
    # The wire format (chat, responses, embeddings, messages, count_tokens); absent in
    # events written before the gateway spoke more than chat completions.
    format: str | None = None


class DisclosureProjected(Model):
    request_id: str
    split: Split
    policy: Literal["per_case", "aggregate", "none"]
    projection: dict[str, Any]
    projection_digest: Sha256Hex


SAFETY_CATEGORIES = (
    "foreign_token",
    "model_not_allowed",
    "timeout",
    "out_of_memory",
    "readonly_write",
    "network_attempt",
    "process_left_behind",
    "output_truncated",
    "process_limit",
    "unisolated_trial",
    "sandbox_error",
    "host_write",
)


class SafetyViolation(Model):
    category: str
    trial_id: str | None = None
    call_id: str | None = None
    detail: str
    evidence_digest: Sha256Hex | None = None


class CandidateNominated(Model):
    candidate: str


class CaseScores(Model):
    case_id: str
    scores: list[Rational]


class RunScored(Model):
    candidate: str
    k: PositiveCount
    per_case: list[CaseScores]
    e_h_plus: Rational
    e_h0: Rational
    g: Rational | None
    # The error bars of E(H+) and of the pinned E(H0) (from the seed-baseline run's per-case
    # scores, when the pin carries them); absent in logs written before they were recorded.
    e_h_plus_error: RoundError | None = Field(default=None, exclude_if=lambda v: v is None)
    e_h0_error: RoundError | None = Field(default=None, exclude_if=lambda v: v is None)


READ_KINDS = ("run", "budget", "tree", "file", "blob", "evaluations", "projection")


class ReadItem(Model):
    """One read the optimizer made through the server's API, as the server answered it.

    ``kind``: ``run`` (the run's info: dev cases, val ids, the candidates), ``budget``,
    ``tree`` (a candidate's file listing; ``contents`` when the files' text came with it),
    ``file`` (one file of a candidate), ``blob`` (a trial's answer or trace named in a
    projection; ``role`` says which), ``evaluations`` (the list of the run's projections),
    ``projection`` (one projection again, by ``request_id``). ``after_seq`` is the last
    event of the run state the read was answered from: what it returned was disclosed at
    or before it.
    """

    kind: Literal["run", "budget", "tree", "file", "blob", "evaluations", "projection"]
    after_seq: Count
    time: str = Field(pattern=TIME_PATTERN)
    candidate: str | None = Field(default=None, exclude_if=lambda v: v is None)
    path: str | None = Field(default=None, exclude_if=lambda v: v is None)
    contents: bool = Field(default=False, exclude_if=lambda v: v is False)
    digest: Sha256Hex | None = Field(default=None, exclude_if=lambda v: v is None)
    role: Literal["answer", "trace"] | None = Field(default=None, exclude_if=lambda v: v is None)
    request_id: str | None = Field(default=None, exclude_if=lambda v: v is None)


class OptimizerRead(Model):
    """A batch of the optimizer's reads, in the order they were answered (written off the
    request path; every batch is flushed before RunClosed)."""

    reads: list[ReadItem] = Field(min_length=1)


class Checkpoint(Model):
    size: Count
    root: Sha256Hex
    note: str = Field(description="the C2SP signed note holding the tlog-checkpoint text")


class StepClosed(Model):
    """The end of step ``step`` of a solve-evolve run: the evolver's one commit
    (``committed``: the CandidateCommitted just before, ``candidate`` = H_t) or its
    explicit ``unchanged`` (``candidate`` = ``parent``). ``parent`` is H_{t-1}, whose
    trials (request ``request_id``) were disclosed as ``projection_digest``;
    ``evolver_tokens`` sums the optimizer-scope model calls recorded since then."""

    step: PositiveCount
    outcome: Literal["committed", "unchanged"]
    parent: str
    candidate: str
    request_id: str
    projection_digest: Sha256Hex
    evolver_tokens: Count


class InSituScored(Model):
    """A solve-evolve run's in-situ score, once its last step has closed: every stream
    case's scores (in stream order) as its step's trials recorded them under H_{t-1},
    J = the mean over cases of each case's mean score, and Base = the pinned NONE run's J
    (a NONE run's own J), delta = J - Base."""

    per_case: list[CaseScores]
    j: Rational
    base: Rational | None
    delta: Rational | None


class RunClosed(Model):
    reason: str
    summary: dict[str, Any] = {}  # noqa: RUF012 (a pydantic field, copied per instance)


class ControlScore(Model):
    """One trial of an audit's control evaluation: its id, case, attempt and score."""

    trial_id: str
    case_id: str
    attempt: Count
    score: Rational


class AuditControlEvaluated(Model):
    """The server's record, in the audited run's own stream and only after its RunClosed,
    that it evaluated ``candidate`` for audit ``audit_id`` (signed by ``auditor_key_id``):
    ``attempts`` on ``case_ids`` of ``split`` (the test split only for ``Hval``, the
    val-selected candidate scored on every held-out case, B5), in request ``request_id``
    of control run ``control_run_id`` (whose tree had ``control_size`` events and root
    ``control_root`` after it). Charged to no optimizer's budget (``budget``) and shown
    to no optimizer (``disclosed_to``): the run's tokens died at its close, before it.
    ``scores`` are the trials' scores; ``scores_digest`` the SHA-256 of their canonical
    list of [case, attempt, score] (holedger.audit.facts.scores_digest)."""

    audit_id: str = Field(pattern=RUN_ID_PATTERN)
    auditor_key_id: KeyIdHex
    harness: Literal["H0", "H0scale", "Hneutral", "Hval"]
    candidate: str
    split: Split
    case_ids: list[str]
    attempts: PositiveCount
    control_run_id: str = Field(pattern=RUN_ID_PATTERN)
    control_size: PositiveCount
    control_root: Sha256Hex
    request_id: str
    scores: list[ControlScore]
    scores_digest: Sha256Hex
    budget: Literal["outside"] = "outside"
    disclosed_to: Literal["none"] = "none"


# The only events a run takes after its RunClosed (each batch closed by a Checkpoint),
# signed by the server: the optimizer's tokens died before them, so none was shown them.
AFTER_CLOSE_TYPES = frozenset({"AuditControlEvaluated"})


EVENT_TYPES: dict[str, type[Model]] = {
    "RunOpened": RunOpened,
    "CandidateCommitted": CandidateCommitted,
    "EvaluationRequested": EvaluationRequested,
    "TrialCompleted": TrialCompleted,
    "GatewayCall": GatewayCall,
    "DisclosureProjected": DisclosureProjected,
    "SafetyViolation": SafetyViolation,
    "CandidateNominated": CandidateNominated,
    "RunScored": RunScored,
    "Checkpoint": Checkpoint,
    "RunClosed": RunClosed,
    "StepClosed": StepClosed,
    "InSituScored": InSituScored,
    "OptimizerRead": OptimizerRead,
    "AuditControlEvaluated": AuditControlEvaluated,
}

_NAME = re.compile(r"^[A-Z][A-Za-z]+$")
assert all(_NAME.match(name) for name in EVENT_TYPES)


def payload_model(event_type: str) -> type[Model]:
    """The payload model of ``event_type``; KeyError when the type is unknown."""
    return EVENT_TYPES[event_type]


__all__ = [
    "AFTER_CLOSE_TYPES",
    "EVENT_TYPES",
    "RUN_ID_PATTERN",
    "SCHEMA_VERSION",
    "TIME_PATTERN",
    "BudgetUse",
    "BudgetVector",
    "CaseCost",
    "DisclosurePolicy",
    "EventEnvelope",
    "Model",
    "PublicKeyInfo",
    "RoundError",
    "SearchSplit",
    "SeedBaseline",
    "ServerToolName",
    "SignedEvent",
    "SplitBudget",
    "SplitUse",
    "TaskTerms",
    "TokenUsage",
    "payload_model",
]
