"""Finishing a run that will not finish by itself: ``holedger run abort``.

A run ends with RunClosed. A nominated run closes itself once its nominee is scored; a
run whose optimizer stopped (interrupted, crashed, gave up) would stay open for good, and
an open run never verifies. Aborting closes it without a score:

1. any dev or val request a stopped server left without trials is recorded first, as
   ``holedger run recover`` does (its trials as not run, then its projection), so every
   search request of the run is complete;
2. a held-out scoring cut short (a nomination interrupted) is left as it is: its trials
   were never recorded, and replay accepts that of an aborted run;
3. a signed RunClosed with reason ``aborted`` and, in its summary, the operator's reason
   (``why``) and no score, then the final Checkpoint.

Replay verifies an aborted run as ``verified-aborted`` ("VERIFIED (aborted)"), and the
analyses leave it out, saying so. A run with an evaluation or a nomination still running
in a live process is refused (retry once it ends, or stop that process first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from holedger.errors import NotFoundError, PolicyError, Unavailable, UsageError
from holedger.replay.report import counted
from holedger.schemas.events import RunClosed

ABORTED = "aborted"
MAX_WHY_CHARS = 1000


@dataclass(frozen=True)
class AbortedRun:
    run_id: str
    why: str
    recovered: list[str]  # requests recorded as not run first
    nominated: str | None  # a nomination whose held-out scoring was cut short
    scored: bool  # the run had a RunScored (it is still left out of analyses)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": ABORTED,
            "why": self.why,
            "recovered_requests": self.recovered,
            "nominated": self.nominated,
            "scored": self.scored,
        }


def check_why(why: str) -> str:
    """The operator's reason, as recorded: printable text, 1 to 1000 characters."""
    text = " ".join(why.split())
    if not text:
        raise UsageError("--reason is empty", hint="say why the run is abandoned")
    if len(text) > MAX_WHY_CHARS or not text.isprintable():
        raise UsageError(f"--reason must be printable text of at most {MAX_WHY_CHARS} characters")
    return text


def abort_run(service: Any, run_id: str, why: str) -> AbortedRun:
    """Close ``run_id`` as aborted (see the module's doc); ``service`` is the RunService."""
    from holedger.server.locks import flock  # the nomination's lock, shared

    why = check_why(why)
    if not service.ledger.has_run(run_id):
        raise NotFoundError(f"no run {run_id}", hint="see 'holedger run list'")
    state = service.states.current(run_id)
    if state.closed:
        raise PolicyError(
            f"run {run_id} is already closed ({state.closed_reason})",
            hint="nothing is left to finish: 'holedger replay RUN' verifies it",
        )
    lock = service.settings.runs_dir / f"{run_id}.nominate.lock"
    with flock(lock, wait=False, remove=False) as held:
        if not held:
            raise Unavailable(
                f"run {run_id}'s nomination is being scored by a live process",
                hint="let it finish (it closes the run), or stop that process and abort again",
            )
        return _abort(service, run_id, why)


def _abort(service: Any, run_id: str, why: str) -> AbortedRun:
    recovered = service._recover(run_id)  # requests a stopped server left without trials

    def decide(st: Any) -> tuple[list[Any], AbortedRun]:
        if st.closed:
            raise PolicyError(f"run {run_id} is already closed ({st.closed_reason})")
        if st.pending:
            raise Unavailable(
                f"run {run_id} has {counted(len(st.pending), 'evaluation')} still running "
                f"in a live process ({', '.join(sorted(st.pending))})",
                hint="let it finish, or stop that process, then abort again",
            )
        summary = {"why": why, "nominated": st.nominated, "scored": st.scored is not None}
        closed = RunClosed(reason=ABORTED, summary=summary)
        done = AbortedRun(run_id, why, recovered, st.nominated, st.scored is not None)
        return [("RunClosed", closed, "server")], done

    result: AbortedRun = service._decide(run_id, decide)
    return result
