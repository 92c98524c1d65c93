"""Run ids and the checkpoint origin of a run, as events spell them; the digest an audit's
control evaluation pins of its trials' scores."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from holedger.errors import UsageError
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import RUN_ID_PATTERN

RUN_ID = re.compile(RUN_ID_PATTERN)
# a UUID's canonical spelling: a run id prefix is lower-case hex with hyphens just here
_UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


def new_run_id() -> str:
    """A fresh run id: a lower-case version 4 UUID."""
    return str(uuid.uuid4())


def checked_run_id(run_id: str) -> str:
    """``run_id`` if it is a run id as events spell it (a lower-case version 4 UUID),
    else UsageError: an event with any other spelling would not verify."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"not a holedger run id: {run_id!r}",
            hint="run ids are lower-case version 4 UUIDs, as 'holedger run list' shows them",
        )
    return run_id


def checked_run_prefix(prefix: str) -> str:
    """``prefix`` (trimmed, lower case) if it can begin a run id and has at least 4
    characters, else UsageError."""
    prefix = prefix.strip().lower()
    if len(prefix) < 4:
        raise UsageError(
            "a run id prefix needs at least 4 characters", hint="see 'holedger run list'"
        )
    if len(prefix) > len(_UUID_SHAPE) or any(
        (c == "-") != (shape == "-") or c not in "-0123456789abcdef"
        for c, shape in zip(prefix, _UUID_SHAPE, strict=False)
    ):
        raise UsageError(
            f"not a run id: {prefix!r}",
            hint="a run id is a UUID such as 7707f7cb-d97d-..., or its first characters; "
            "see 'holedger run list'",
        )
    return prefix


def origin_of(run_id: str) -> str:
    """The origin line of a run's tlog checkpoints (C2SP tlog-checkpoint)."""
    return f"holedger/run/{run_id}"


def control_label(audit_id: str, run_id: str) -> str:
    """The optimizer label of an audit's control run: its RunOpened names the audit and
    the audited run with it (docs/AUDITS.md, "Control evaluations")."""
    return f"hda-control audit={audit_id} run={run_id}"


def names_control(
    control_of: Mapping[str, Any] | None, optimizer: str, audit_id: str, run_id: str
) -> bool:
    """Whether a control run's RunOpened names exactly audit ``audit_id`` of run ``run_id``:
    by its signed field ``control_of``, or (a control run opened before that field) by its
    optimizer label."""
    if control_of is None:
        return optimizer == control_label(audit_id, run_id)
    return dict(control_of) == {"audit_id": audit_id, "run_id": run_id}


def control_scores_digest(rows: Iterable[tuple[str, int, Fraction]]) -> str:
    """What an audit's control evaluation pins of its trials: the SHA-256 of the canonical
    JSON of the sorted [case id, attempt, score as p/q] rows."""
    listed = sorted([case, attempt, str(Fraction(score))] for case, attempt, score in rows)
    return hashlib.sha256(canonical_json(listed)).hexdigest()
