"""Running one trial: a candidate on one case, in a sandbox, scored outside it.

The case's input goes to the entrypoint's stdin as JSON. When a gateway is attached the
trial gets a token and a unix socket of its own, revoked and closed when it ends. The
sandbox runs wherever the executor puts it (:mod:`holedger.server.executor`); the answer
is parsed from its stdout (:func:`holedger.protocol.answers.parse_answer`) and scored by
the task's verifier in this (trusted) process.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol

from holedger.errors import CanonicalError
from holedger.executors.faults import TrialLost
from holedger.ledger.store import Ledger
from holedger.protocol.answers import answer_bytes, parse_answer
from holedger.protocol.rules import trial_score
from holedger.sandboxes import Limits, SandboxResult
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import SafetyViolation, TokenUsage, TrialCompleted
from holedger.server.candidates import CandidateRepo
from holedger.server.executor import Executor, GatewayRoute, TrialPlan
from holedger.untrusted import escape_text

# The trial id of a lost trial's second attempt: the first's id and this.
RETRY_SUFFIX = "-retry"


@dataclass(frozen=True)
class TrialRef:
    """Which trial: its run, request, id, candidate, split, case and attempt, and the
    case's input (what the server knows of a trial before it runs)."""

    run_id: str
    request_id: str
    trial_id: str
    candidate: str
    split: str
    case_id: str
    attempt: int
    case_input: Any


@dataclass(frozen=True)
class GatewayUsage:
    tokens: TokenUsage
    calls: int
    # Calls that ended in an error, by error code (not recorded in TrialCompleted: the
    # GatewayCall events hold each status; this is for telling the caller at once).
    failed: dict[str, int] = field(default_factory=dict)


@dataclass
class TrialAccess:
    """What a trial gets from the gateway: a token and a socket; usage filled at the end."""

    token: str
    socket: Path
    usage: GatewayUsage = field(default_factory=lambda: GatewayUsage(TokenUsage(), 0))


class TrialGateway(Protocol):
    """The model gateway as trials see it (see :mod:`holedger.server.gateway_link`)."""

    def trial(self, ref: TrialRef) -> contextlib.AbstractContextManager[TrialAccess]: ...


@dataclass
class TrialOutcome:
    """A finished trial: the TrialCompleted payload and its safety observations."""

    completed: TrialCompleted
    violations: list[SafetyViolation]
    answer: Any | None
    failed_calls: dict[str, int] = field(default_factory=dict)


@dataclass
class TrialRunner:
    """Runs trials of one run's candidates through an executor; thread-safe.

    For each trial it opens the trial's gateway access, has the executor run the sandbox
    (:class:`~holedger.server.executor.TrialPlan` in, SandboxResult out), closes the access
    (revoking the token, summing the trial's calls), then parses the answer and scores it
    with the task's verifier here, in the trusted process.
    """

    ledger: Ledger
    repo: CandidateRepo
    executor: Executor
    backend: str
    entrypoint: list[str]
    model: str
    limits: Limits
    verify: Callable[[str, Any], Fraction]
    gateway: TrialGateway | None = None
    # The task's timeout rule (TaskTerms.timeout_score, rules.trial_score): a timed-out
    # trial scores 0 unless the terms say "verifier".
    timeout_score: str | None = "zero"

    def run(self, ref: TrialRef) -> TrialOutcome:
        """Run the trial. One an executor lost (its node or worker died, its result never
        came) runs once more, elsewhere, under a new trial id: the lost attempt's model
        calls stay recorded under its own id. Lost twice, it is recorded as not run."""
        result, usage = self._attempt(ref, ())
        if isinstance(result, TrialLost):
            first = result
            ref = replace(ref, trial_id=f"{ref.trial_id}{RETRY_SUFFIX}")
            result, usage = self._attempt(ref, (first.node,) if first.node else ())
            if isinstance(result, TrialLost):
                detail = f"not run: {first.message}; once more: {result.message}"
                return unfinished_trial(
                    self.backend, self.limits.as_record(), ref, detail, usage.tokens, usage.calls
                )
        return self._outcome(ref, result, usage)

    def _attempt(
        self, ref: TrialRef, avoid: tuple[str, ...]
    ) -> tuple[SandboxResult | TrialLost, GatewayUsage]:
        stdin = (
            canonical_json(ref.case_input)
            if _canonical_ok(ref.case_input)
            else (json.dumps(ref.case_input).encode())
        )
        tree = self.repo.tree_of(ref.candidate)
        result: SandboxResult | TrialLost
        with self._access(ref) as access:
            plan = TrialPlan(
                run_id=ref.run_id,
                trial_id=ref.trial_id,
                tree=tree,
                repository=self.repo.path,
                argv=tuple(self.entrypoint),
                stdin=stdin + b"\n",
                model=self.model,
                limits=self.limits,
                backend=self.backend,
                gateway=None if access is None else GatewayRoute(access.token, access.socket),
                avoid=avoid,
            )
            try:
                result = self.executor.submit(plan).result()
            except TrialLost as lost:
                result = lost
        usage = access.usage if access is not None else GatewayUsage(TokenUsage(), 0)
        return result, usage

    @contextlib.contextmanager
    def _access(self, ref: TrialRef) -> Iterator[TrialAccess | None]:
        if self.gateway is None:
            yield None
            return
        with self.gateway.trial(ref) as access:
            yield access

    def _outcome(self, plan: TrialRef, result: SandboxResult, usage: GatewayUsage) -> TrialOutcome:
        natural, recorded = parse_answer(result.stdout)
        score = Fraction(0)
        answer_digest = None
        if recorded is not None:
            answer_digest = self.ledger.put_blob(answer_bytes(recorded))
            score = Fraction(self.verify(plan.case_id, natural))
            if not 0 <= score <= 1:
                raise ValueError(f"verifier scored {score} outside [0, 1]")
            score = trial_score(score, timed_out=result.timed_out, timeout_score=self.timeout_score)
        output_digest = self.ledger.put_blob(result.stdout)
        trace_digest = self.ledger.put_blob(result.stderr)
        completed = trial_completed(
            plan,
            backend=result.backend,
            isolation=result.isolation,
            limits=self.limits.as_record(),
            exit_status=result.exit_status,
            timed_out=result.timed_out,
            oom=result.oom,
            wall_ms=max(0, result.wall_ms),
            cpu_ms=result.cpu_ms,
            answer_digest=answer_digest,
            output_digest=output_digest,
            trace_digest=trace_digest,
            score=score,
            tokens=usage.tokens,
            gateway_calls=usage.calls,
            node=result.node,
        )
        violations = [
            SafetyViolation(
                category=obs.category,
                trial_id=plan.trial_id,
                detail=obs.detail[:2000],
                evidence_digest=trace_digest,
            )
            for obs in result.observations
        ]
        return TrialOutcome(completed, violations, recorded, dict(usage.failed))


def trial_completed(
    plan: TrialRef,
    *,
    backend: str,
    isolation: Literal["isolated", "none"],
    limits: dict[str, int],
    tokens: TokenUsage,
    gateway_calls: int,
    exit_status: int | None = None,
    timed_out: bool = False,
    oom: bool = False,
    wall_ms: int = 0,
    cpu_ms: int | None = None,
    answer_digest: str | None = None,
    output_digest: str | None = None,
    trace_digest: str | None = None,
    score: Fraction = Fraction(0),
    node: str | None = None,
) -> TrialCompleted:
    """The one constructor of a TrialCompleted payload: the trial's identity from its plan,
    and what came of it (by default a trial that gave nothing: score 0)."""
    return TrialCompleted(
        request_id=plan.request_id,
        trial_id=plan.trial_id,
        candidate=plan.candidate,
        split=plan.split,
        case_id=plan.case_id,
        attempt=plan.attempt,
        backend=backend,
        isolation=isolation,
        limits=limits,
        exit_status=exit_status,
        timed_out=timed_out,
        oom=oom,
        wall_ms=wall_ms,
        cpu_ms=cpu_ms,
        answer_digest=answer_digest,
        output_digest=output_digest,
        trace_digest=trace_digest,
        score=score,
        tokens=tokens,
        gateway_calls=gateway_calls,
        node=node,
    )


def unfinished_trial(
    backend: str,
    limits: dict[str, int],
    plan: TrialRef,
    detail: str,
    tokens: TokenUsage | None = None,
    calls: int = 0,
    isolation: Literal["isolated", "none"] = "none",
) -> TrialOutcome:
    """A trial recorded without a result: score 0, a sandbox_error violation saying why,
    and the model calls recorded under its trial id (none when it never started)."""
    completed = trial_completed(
        plan,
        backend=backend,
        isolation=isolation,
        limits=limits,
        tokens=tokens or TokenUsage(),
        gateway_calls=calls,
    )
    violation = SafetyViolation(
        category="sandbox_error", trial_id=plan.trial_id, detail=escape_text(detail)
    )
    return TrialOutcome(completed, [violation], None)


def outcome_warnings(outcomes: Sequence[TrialOutcome]) -> list[str]:
    """What went wrong in a request's trials, in a few lines for whoever asked.

    A score of 0 says nothing of why; these lines do: trials that gave no answer, each
    counted once under its cause (could not run, timed out, out of memory, else its exit
    status), trials that answered but were cut short, and model calls the gateway
    answered with an error (by error code, else reason). Every fact here is also in the
    recorded events.
    """
    total = len(outcomes)
    lines: list[str] = []
    causes: Counter[str] = Counter()
    cut_short: Counter[str] = Counter()
    for outcome in outcomes:
        cause = _cause(outcome)
        if outcome.answer is None:
            causes[cause or _exit_text(outcome.completed.exit_status)] += 1
        elif cause is not None:
            cut_short[cause] += 1
    if causes:
        lines.append(
            f"{sum(causes.values())} of {total} trials gave no answer: {_tally_text(causes)}"
        )
    if cut_short:
        lines.append(
            f"{sum(cut_short.values())} of {total} trials answered but were cut short: "
            f"{_tally_text(cut_short)}"
        )
    failed: Counter[str] = Counter()
    for outcome in outcomes:
        failed.update(outcome.failed_calls)
    if failed:
        calls = sum(o.completed.gateway_calls for o in outcomes)
        lines.append(f"{sum(failed.values())} of {calls} model calls failed: {_tally_text(failed)}")
        if any(name.startswith("upstream unreachable") for name in failed):
            lines.append(
                "the gateway could not reach its upstream model: is it running, and is "
                "upstream_base_url in the home's gateway.toml right?"
            )
    return lines


def _cause(outcome: TrialOutcome) -> str | None:
    """Why a trial was stopped, if it was: its sandbox failed, it timed out, or ran out
    of memory (None: it ended by itself)."""
    if any(v.category == "sandbox_error" for v in outcome.violations):
        return "could not run (sandbox_error)"
    if outcome.completed.timed_out:
        return "timed out"
    if outcome.completed.oom:
        return "out of memory"
    return None


def _exit_text(status: int | None) -> str:
    return "no exit status" if status is None else f"exit status {status}"


def _tally_text(counts: Counter[str]) -> str:
    return "; ".join(f"{name} ({n})" for name, n in sorted(counts.items(), key=lambda i: -i[1]))


def _canonical_ok(value: Any) -> bool:
    try:
        canonical_json(value)
    except CanonicalError:
        return False
    return True
