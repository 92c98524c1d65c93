"""What a fold of a replayed run is built from (ReplayContext) and what it is (Fold).

The engine verifies a run's integrity and hands every verified event, in order, to the
folds built for that run. It knows no fold: its caller gives the factories and
``inputs``, a typed value the engine hands to every fold untouched (for the registered
checks, :class:`holedger.replay.inputs.CheckInputs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from holedger.ledger.records import Record
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import Model, RunOpened

InputsT = TypeVar("InputsT")


class BlobSource(Protocol):
    def blob(self, digest: str) -> bytes | None:
        """The blob's bytes, or None when absent."""

    def redacted(self, digest: str) -> bool:
        """True when the blob was deliberately left out (a redacted bundle)."""


@dataclass
class ReplayContext(Generic[InputsT]):
    """One replayed run, as its folds see it: made when its RunOpened verifies."""

    run_id: str
    opened: RunOpened
    blobs: BlobSource
    inputs: InputsT
    # Set before ``finish`` when the log breaks: the last seq the folds were given
    # (-1: none). What a later event would have completed (a request's trials, its
    # disclosure, the score) is then not judged missing: it may lie past the break.
    cut_after: int | None = None


class Fold(Protocol):
    name: str

    def apply(self, rec: Record, payload: Model) -> None: ...

    def finish(self, out: ReportBuilder) -> None: ...


FoldFactory = Callable[[ReplayContext[InputsT]], Fold]
