"""The optimizer's reads: every OptimizerRead names only what had been disclosed to it.

The server records each read the optimizer made through its API (``ReadItem``: the
run's info, its budget, a candidate's tree or one of its files, a blob named in a
projection) in batches of OptimizerRead events, each read with ``after_seq``, the last
event of the run state it was answered from. For every read replay checks
(``reads_disclosed``; a failure is a leakage failure):

* it was answered from a state the log had reached: ``after_seq`` is before the
  OptimizerRead that records it;
* a blob it fetched was named by a DisclosureProjected at or before ``after_seq``, in
  the role it says (``answer``: a trial's ``answer_digest``; ``trace``: its
  ``trace_digest``); a blob no projection named (a held-out trial's output, a blob of
  another run) was never the optimizer's to fetch;
* a tree or file it read is of a candidate committed at or before ``after_seq``, and a
  file read names its path;
* a projection it read again was recorded (DisclosureProjected) at or before
  ``after_seq``.

A log written before reads were recorded has no OptimizerRead: the check passes and says
that no read events were recorded.
"""

from __future__ import annotations

from collections import Counter

from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import (
    CandidateCommitted,
    DisclosureProjected,
    Model,
    OptimizerRead,
    ReadItem,
)

CHECK = "reads_disclosed"
NO_READS = "no read events recorded"


class ReadsFold:
    name = "reads"

    def __init__(self, ctx: CheckContext) -> None:
        self.committed: dict[str, int] = {}  # candidate -> seq of its CandidateCommitted
        self.projected: dict[str, int] = {}  # request id -> seq of its DisclosureProjected
        self.disclosed: dict[str, tuple[int, str]] = {}  # digest -> (first seq, role)
        self.kinds: Counter[str] = Counter()
        self.roles: Counter[str] = Counter()
        self.batches = 0
        self.failures: list[tuple[int, str]] = []

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted):
            self.committed.setdefault(payload.candidate, rec.seq)
        elif isinstance(payload, DisclosureProjected):
            self.projected.setdefault(payload.request_id, rec.seq)
            for digest, role in rules.fetchable_roles(payload.projection).items():
                self.disclosed.setdefault(digest, (rec.seq, role))
        elif isinstance(payload, OptimizerRead):
            self.batches += 1
            for item in payload.reads:
                self.kinds[item.kind] += 1
                if item.role is not None:
                    self.roles[item.role] += 1
                problem = self._problem(rec.seq, item)
                if problem is not None:
                    self.failures.append((rec.seq, f"leakage: {problem}"))

    def _problem(self, seq: int, item: ReadItem) -> str | None:
        if item.after_seq >= seq:
            return (
                f"a {item.kind} read answered from seq {item.after_seq}, not before its "
                f"record at seq {seq}"
            )
        if item.kind == "blob":
            return self._blob(item)
        if item.kind == "projection":
            at = self.projected.get(item.request_id or "")
            if at is None or at > item.after_seq:
                return (
                    f"the optimizer read the projection of request {item.request_id}, which "
                    f"was not recorded by seq {item.after_seq}"
                )
        if item.kind in ("tree", "file"):
            if item.candidate is None:
                return f"a {item.kind} read names no candidate"
            at = self.committed.get(item.candidate)
            if at is None or at > item.after_seq:
                return (
                    f"the optimizer read the {item.kind} of {item.candidate[:12]}, which "
                    f"was not a committed candidate at seq {item.after_seq}"
                )
            if item.kind == "file" and not item.path:
                return "a file read names no path"
        return None

    def _blob(self, item: ReadItem) -> str | None:
        if item.digest is None:
            return "a blob read names no digest"
        shown = self.disclosed.get(item.digest)
        if shown is None or shown[0] > item.after_seq:
            return (
                f"the optimizer fetched blob {item.digest[:16]}, which no projection had "
                f"disclosed to it by seq {item.after_seq}"
            )
        if item.role != shown[1]:
            return (
                f"blob {item.digest[:16]} is recorded as a {item.role or 'blob'} read; its "
                f"projection disclosed it as an {shown[1]}"
            )
        return None

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "the optimizer fetched only what had been disclosed to it")
        reads = sum(self.kinds.values())
        out.section(
            "reads",
            {
                "recorded": self.batches > 0,
                "batches": self.batches,
                "reads": reads,
                "by_kind": dict(sorted(self.kinds.items())),
                "blobs_by_role": dict(sorted(self.roles.items())),
            },
        )
        for seq, reason in self.failures:
            out.fail(seq, "OptimizerRead", reason, check=CHECK)
        if self.failures:
            return
        if not self.batches:
            out.check(CHECK, True, f"{NO_READS} (a log written before reads were recorded)")
            return
        blobs = self.kinds.get("blob", 0)
        out.check(
            CHECK,
            True,
            f"{counted(reads, 'read')} in {counted(self.batches, 'batch', 'batches')}: "
            f"{counted(blobs, 'blob')} fetched, each disclosed by a projection before it; "
            "every tree and file read of a committed candidate",
        )
