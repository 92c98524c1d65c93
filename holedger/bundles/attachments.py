"""Attachments: what a room above this one carries in a run bundle, beside the run.

This room does not read them: a room registers a name with how to make its bytes for a
run in a home (``make``, for ``export``) and how to verify them (``verify``, for ``verify``), when
the command line is built. The audit room registers ``audits`` (a run's audits, see
docs/AUDITS.md). ``verify`` reports each attachment as a check of its name; one no
registered room reads is a warning, never passed over silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from holedger.ledger.keys import PublicKey
from holedger.replay.report import ReportBuilder


@dataclass(frozen=True)
class Verdict:
    """What verifying an attachment found: its problems (none: verified), one line saying
    what passed, and a section for the report."""

    problems: list[str]
    detail: str
    section: dict[str, Any]


@dataclass(frozen=True)
class Attachment:
    name: str
    make: Callable[[Any, Any, str], bytes]  # (ledger, the home's settings, run id) -> bytes
    verify: Callable[[bytes, str, Sequence[PublicKey]], Verdict]  # (bytes, run id, keys)


REGISTRY: dict[str, Attachment] = {}


def register(attachment: Attachment) -> None:
    REGISTRY[attachment.name] = attachment


class AttachmentCheck:
    """A check of the bundle (no fold of the events): each attachment verified by the room
    that registered it, reported under its name."""

    name = "attachments"

    def __init__(
        self, attached: dict[str, bytes], run_id: str, trusted: Sequence[PublicKey]
    ) -> None:
        self.attached = attached
        self.run_id = run_id
        self.trusted = list(trusted)

    def apply(self, rec: Any, payload: Any) -> None:
        return None

    def finish(self, out: ReportBuilder) -> None:
        for name, data in sorted(self.attached.items()):
            known = REGISTRY.get(name)
            if known is None:
                out.warn(name, False, f"attachment {name!r}: no room of this holedger reads it")
                continue
            verdict = known.verify(data, self.run_id, self.trusted)
            out.declare(name, verdict.detail)
            for problem in verdict.problems:
                out.fail(None, None, problem, check=name)
            if not verdict.problems:
                out.check(name, True, verdict.detail)
            out.section(name, verdict.section)
