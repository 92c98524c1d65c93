"""The events of an audit log (schema version 1).

An audit is a stream of its own: each event is an envelope ``{audit_id, seq, type,
schema_version, time, role, key_id, prev_hash, payload}`` signed with Ed25519 over its
canonical JSON, hash-chained and checkpointed like a run's. Two roles sign: ``auditor``
(the audit's own key, declared in AuditOpened) and ``server`` (the audited run's server
key, which alone may record a control evaluation).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from holedger.schemas.events import RUN_ID_PATTERN, Model, PublicKeyInfo
from holedger.schemas.types import Rational, Sha256Hex

AUDIT_SCHEMA_VERSION = 1
AuditRole = Literal["auditor", "server"]
AUDIT_ROLES: tuple[AuditRole, ...] = ("auditor", "server")
Harness = Literal["H0", "H0scale", "Hhat", "Hneutral", "Hval"]


class CheckpointRef(Model):
    """A tree head of a log: its size and Merkle root (hex)."""

    size: int = Field(ge=1)
    root: Sha256Hex


class AuditOpened(Model):
    """What the audit is bound to: exactly one run, at one of its checkpoints."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    run_checkpoint: CheckpointRef
    run_server_key: PublicKeyInfo
    auditor_key: PublicKeyInfo
    kind: Literal["hda"] = "hda"
    readings: dict[str, str]


class ControlEvaluated(Model):
    """The trusted server's word (role ``server``): it evaluated ``candidate`` for this
    audit in control run ``control_run_id`` (request ``request_id``), outside any
    optimizer's budget and shown to no optimizer; ``scores_digest`` pins the per-trial
    scores (SHA-256 of the canonical list of [case, attempt, score]). ``run_seq`` is the
    seq of the same statement (AuditControlEvaluated) in the audited run's own stream,
    after its RunClosed."""

    audit_id: str = Field(pattern=RUN_ID_PATTERN)
    harness: Harness
    candidate: str
    control_run_id: str = Field(pattern=RUN_ID_PATTERN)
    control_checkpoint: CheckpointRef
    request_id: str
    split: Literal["dev", "val", "test"]
    case_ids: list[str]
    attempts: int = Field(ge=1)
    scores_digest: Sha256Hex
    run_seq: int = Field(ge=1)
    disclosed: Literal[False] = False


class GateComputed(Model):
    """B1 over the paired search cases (every number exact; see holedger.audit.stats)."""

    gate: dict[str, Any]
    sources: dict[str, str]
    strata: list[dict[str, Any]] = Field(default_factory=list)
    # B6 on the held-out split, and the types left out of the search set
    held_out_strata: list[dict[str, Any]] = Field(default_factory=list)
    left_out_types: list[dict[str, Any]] = Field(default_factory=list)


class ScaleDerived(Model):
    """B2: k, its basis, the aggregator and S(H0scale) (``None`` until evaluated)."""

    scale: dict[str, Any]
    aggregator: Literal["majority_vote", "pass_at_k"]
    s_scaled: Rational | None = None


class FindingRecorded(Model):
    """A shortcut found: by a detector (``detector``) or added by a person (``manual``)."""

    category: str = Field(min_length=1, max_length=64)
    source: Literal["detector", "manual"]
    summary: str = Field(min_length=1, max_length=2000)
    evidence: dict[str, Any]


class NeutralCommitted(Model):
    """Ĥneutral: a commit whose parent is Ĥ, its diff against Ĥ stored as a blob."""

    commit: str
    parent: str
    control_run_id: str = Field(pattern=RUN_ID_PATTERN)
    changed_paths: list[str]
    diff_digest: Sha256Hex


class Decomposed(Model):
    """B4 (with B5 and B6): the terms, the shares, the identity, the bounds."""

    status: Literal["decomposed", "not_significant", "pending_neutral"]
    decomposition: dict[str, Any] | None
    transfer: dict[str, Any] | None
    strata: list[dict[str, Any]]


class AuditCheckpoint(Model):
    size: int = Field(ge=1)
    root: Sha256Hex
    note: str


AUDIT_EVENT_TYPES: dict[str, type[Model]] = {
    "AuditOpened": AuditOpened,
    "ControlEvaluated": ControlEvaluated,
    "GateComputed": GateComputed,
    "ScaleDerived": ScaleDerived,
    "FindingRecorded": FindingRecorded,
    "NeutralCommitted": NeutralCommitted,
    "Decomposed": Decomposed,
    "Checkpoint": AuditCheckpoint,
}
