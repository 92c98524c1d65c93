"""Replay of the gateway: re-derive the target-token budget and check every decision.

From the GatewayCall events alone (no re-execution) this projection checks:

* ``gateway_tokens``: each call's tokens follow the convention (total = input + output,
  cached within input, reasoning within output), a denied call charged nothing, and a call
  whose usage never arrived was charged exactly its reservation;
* ``gateway_allowlist``: every allowed target call asked for a model in the run's
  allow-list (exact names), and every "model_not_allowed" denial asked for one outside it;
* ``gateway_budget``: the settlements carry reservation indices 0..M-1 once each; for
  every budget decision the recorded state (settled, outstanding, per trial too) equals
  the state re-derived from the settlements before it, and the decision is what
  :func:`holedger.protocol.tokens.budget_denial` says for that state;
* ``gateway_cap``: the settled target tokens do not exceed the cap (overshoot 0);
* ``gateway_trial_totals``: each TrialCompleted's tokens and gateway_calls equal the sum
  and count of the GatewayCalls attributed to its trial.
"""

from __future__ import annotations

from array import array
from collections.abc import MutableSequence
from itertools import chain
from typing import NamedTuple

from holedger.ledger.records import Record
from holedger.protocol.endpoints import COUNT_TOKENS, METERED_PATHS, MODEL_PATHS
from holedger.protocol.tokens import budget_denial, optimizer_cap
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import (
    GatewayBudgetState,
    GatewayCall,
    Model,
    RunOpened,
    TrialCompleted,
)

# The allowed calls of a METERED_PATHS endpoint hold a reservation; the allow-list decides
# the calls of every MODEL_PATHS endpoint. Logs written before count_tokens was metered
# hold its calls unreserved, charged 0.


def _free(call: GatewayCall) -> bool:
    """An unreserved count_tokens call charged nothing (the rule it was written under)."""
    return call.endpoint == COUNT_TOKENS and call.reserved == 0 and call.tokens.total == 0


INT64_MAX = 2**63 - 1

# Failures found while events are applied are kept as integers (a seq, a kind, the kind's
# arguments) and reported at the end in the order they were found.
_TOTAL, _SPLIT, _DENIED_CHARGED, _ESTIMATED, _ALLOWED_UNLISTED, _DENIED_LISTED = range(6)
_NO_RESERVATION, _NO_STATE = 6, 7
_ARITY = (3, 0, 0, 2, 1, 1, 0, 0)

# Per trial: input, cached, output, reasoning, total, cache_write, calls.
_TRIAL_STRIDE = 7
# Per budget decision: settled, outstanding, settled_calls, reservations, trial_settled,
# trial_outstanding (the recorded state; cap and trial_cap are kept only when unusual).
_STATE_STRIDE = 6
# Per TrialCompleted: seq, trial code, input, cached, output, reasoning, total,
# cache_write, calls.
_COMPLETED_STRIDE = 9


def _zeros(size: int, wide: bool = False) -> MutableSequence[int]:
    """``size`` zeros: 64-bit unless ``wide`` (a sum could pass 2**63)."""
    if wide:
        return [0] * size
    return array("q", [0]) * size


INT32_MAX = 2**31 - 1


def _counts(size: int, largest: int) -> array[int]:
    """``size`` zeros for positions or counts up to ``largest``: 32-bit when they fit."""
    return array("i" if largest <= INT32_MAX else "q", [0]) * size


def _push(column: array[int], value: int) -> array[int]:
    """Append to a column that starts 32-bit and widens to 64-bit when a value needs it."""
    try:
        column.append(value)
    except OverflowError:
        column = array("q", column)
        column.append(value)
    return column


class _FailureLog:
    """Failures found at apply time, as integer columns."""

    def __init__(self) -> None:
        self.seqs: array[int] = array("q")
        self.kinds: array[int] = array("B")
        self.args: array[int] = array("q")
        self.texts: list[str] = []
        self._text_codes: dict[str, int] = {}

    def add(self, seq: int, kind: int, *args: int) -> None:
        self.seqs.append(seq)
        self.kinds.append(kind)
        self.args.extend(args)

    def text(self, value: str) -> int:
        code = self._text_codes.get(value)
        if code is None:
            code = self._text_codes[value] = len(self.texts)
            self.texts.append(value)
        return code

    def emit(self, out: ReportBuilder) -> None:
        pos = 0
        for seq, kind in zip(self.seqs, self.kinds, strict=True):
            arity = _ARITY[kind]
            check, reason = self._describe(kind, self.args[pos : pos + arity])
            pos += arity
            out.fail(seq, "GatewayCall", reason, check=check)

    def _describe(self, kind: int, a: array[int]) -> tuple[str, str]:
        if kind == _TOTAL:
            return "gateway_tokens", f"total {a[0]} is not input {a[1]} + output {a[2]}"
        if kind == _SPLIT:
            return "gateway_tokens", "cached tokens exceed input or reasoning tokens exceed output"
        if kind == _DENIED_CHARGED:
            return "gateway_tokens", "a denied call was charged or holds a reservation"
        if kind == _ESTIMATED:
            return "gateway_tokens", f"estimated usage {a[0]} is not the reservation {a[1]}"
        if kind == _ALLOWED_UNLISTED:
            model = self.texts[a[0]]
            return "gateway_allowlist", f"model {model!r} allowed but not in the allow-list"
        if kind == _DENIED_LISTED:
            model = self.texts[a[0]]
            return "gateway_allowlist", f"model {model!r} denied but it is in the allow-list"
        if kind == _NO_RESERVATION:
            return "gateway_budget", "allowed without a reservation"
        return "gateway_budget", "budget decision without its state"


class _State(NamedTuple):
    cap: int
    settled: int
    outstanding: int
    settled_calls: int
    reservations: int
    trial_cap: int | None
    trial_settled: int
    trial_outstanding: int

    def model(self) -> GatewayBudgetState:
        return GatewayBudgetState.model_construct(**self._asdict())


class _Fenwick:
    def __init__(self, size: int, wide: bool) -> None:
        self.tree = _zeros(size + 1, wide)

    def add(self, i: int, value: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += value
            i += i & -i

    def prefix(self, n: int) -> int:
        """Sum of the first ``n`` entries."""
        total = 0
        n = min(n, len(self.tree) - 1)
        while n > 0:
            total += self.tree[n]
            n -= n & -n
        return total


class GatewayFold:
    """Checks each call as it is applied; keeps running totals and integer columns only.

    Per target call holding a reservation it keeps four integers (its settlement), per
    budget decision ten and a byte, per trial one id and six sums, per TrialCompleted
    eight integers: the budget decisions are checked offline at :meth:`finish`, since a
    decision's outstanding reservations settle after it.
    """

    name = "gateway"

    def __init__(self, ctx: CheckContext) -> None:
        opened: RunOpened = ctx.opened
        self.models = frozenset(opened.terms.models)
        self.cap = opened.terms.budget.target_tokens
        self.trial_cap = opened.terms.budget.per_trial_tokens
        self.optimizer_cap = optimizer_cap(opened.terms.budget)
        self.call_count = 0
        self.trial_count = 0
        self._call_failures = _FailureLog()
        self._budget_failures = _FailureLog()
        # section totals: input, cached, output, reasoning, total
        self._target = [0] * 5
        self._optimizer = [0] * 5
        self._cache_write = {"target": 0, "optimizer": 0}  # within input
        self._estimated = 0
        self._denied: dict[str, int] = {}
        # trials, by code: sums of the calls attributed to them
        self._trial_codes: dict[str, int] = {}
        self._trial_sums: MutableSequence[int] = array("q")
        # settlements (target calls holding a reservation), in ledger order
        self._s_index: array[int] = array("i")
        self._s_trial: array[int] = array("i")
        self._s_reserved: array[int] = array("q")
        self._s_total: array[int] = array("q")
        self._settled_total = 0
        self._reserved_total = 0
        # budget decisions, in ledger order
        self._d_seq: array[int] = array("i")
        self._d_trial: array[int] = array("i")
        self._d_index: array[int] = array("i")  # reservation index, -1 for none
        self._d_reserved: array[int] = array("q")
        self._d_allowed = bytearray()
        self._d_state: array[int] = array("q")
        self._d_caps: dict[int, tuple[int, int | None]] = {}
        self._completed: array[int] = array("q")

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, GatewayCall):
            self._apply_call(rec.seq, payload)
        elif isinstance(payload, TrialCompleted):
            t = payload.tokens
            self.trial_count += 1
            self._completed.extend(
                (
                    rec.seq,
                    self._trial(payload.trial_id),
                    t.input,
                    t.cached,
                    t.output,
                    t.reasoning,
                    t.total,
                    t.cache_write,
                    payload.gateway_calls,
                )
            )

    def _apply_call(self, seq: int, call: GatewayCall) -> None:
        self.call_count += 1
        self._check_tokens(seq, call)
        self._check_allowlist(seq, call)
        t = call.tokens
        usage = (t.input, t.cached, t.output, t.reasoning, t.total)
        if call.trial_id is not None:
            self._add_to_trial(self._trial(call.trial_id), (*usage, t.cache_write))
        if not call.allowed:
            key = call.code or "denied"
            self._denied[key] = self._denied.get(key, 0) + 1
        totals = self._target if call.scope == "target" else self._optimizer
        for k, value in enumerate(usage):
            totals[k] += value
        self._cache_write[call.scope] += t.cache_write
        if call.scope == "target":
            if call.usage_estimated:
                self._estimated += 1
            self._apply_budget(seq, call)

    def _trial(self, trial_id: str) -> int:
        code = self._trial_codes.get(trial_id)
        if code is None:
            code = self._trial_codes[trial_id] = len(self._trial_codes)
            self._trial_sums.extend((0,) * _TRIAL_STRIDE)
        return code

    def _add_to_trial(self, code: int, usage: tuple[int, ...]) -> None:
        base = code * _TRIAL_STRIDE
        sums = self._trial_sums
        new = [sums[base + k] + value for k, value in enumerate(usage)]
        new.append(sums[base + 6] + 1)
        if max(new) > INT64_MAX and isinstance(sums, array):
            sums = self._trial_sums = list(sums)
        for k, value in enumerate(new):
            sums[base + k] = value

    # ------------------------------------------------------------------ per call

    def _check_tokens(self, seq: int, call: GatewayCall) -> None:
        t = call.tokens
        log = self._call_failures
        if t.total != t.input + t.output:
            log.add(seq, _TOTAL, t.total, t.input, t.output)
        elif t.cached + t.cache_write > t.input or t.reasoning > t.output:
            log.add(seq, _SPLIT)
        elif not call.allowed and (t.total or call.reservation_index is not None):
            log.add(seq, _DENIED_CHARGED)
        elif call.usage_estimated and t.total != call.reserved:
            log.add(seq, _ESTIMATED, t.total, call.reserved)

    def _check_allowlist(self, seq: int, call: GatewayCall) -> None:
        if call.scope != "target" or call.model_requested is None:
            return
        listed = call.model_requested in self.models
        log = self._call_failures
        if call.allowed and call.endpoint in MODEL_PATHS and not listed:
            log.add(seq, _ALLOWED_UNLISTED, log.text(call.model_requested))
        if call.code == "model_not_allowed" and listed:
            log.add(seq, _DENIED_LISTED, log.text(call.model_requested))

    def _apply_budget(self, seq: int, call: GatewayCall) -> None:
        index = call.reservation_index
        if index is not None:
            self._s_index = _push(self._s_index, index)
            self._s_trial = _push(self._s_trial, self._trial(call.trial_id or ""))
            self._s_reserved.append(call.reserved)
            self._s_total.append(call.tokens.total)
            self._settled_total += call.tokens.total
            self._reserved_total += call.reserved
        if call.allowed and call.endpoint in METERED_PATHS and index is None and not _free(call):
            self._budget_failures.add(seq, _NO_RESERVATION)
        if index is not None or call.code == "budget_exhausted":
            state = call.budget
            if state is None:
                self._budget_failures.add(seq, _NO_STATE)
                return
            if state.cap != self.cap or state.trial_cap != self.trial_cap:
                self._d_caps[len(self._d_seq)] = (state.cap, state.trial_cap)
            self._d_seq = _push(self._d_seq, seq)
            self._d_trial = _push(self._d_trial, self._trial(call.trial_id or ""))
            self._d_index = _push(self._d_index, -1 if index is None else index)
            self._d_reserved.append(call.reserved)
            self._d_allowed.append(call.allowed)
            self._d_state.extend(
                (
                    state.settled,
                    state.outstanding,
                    state.settled_calls,
                    state.reservations,
                    state.trial_settled,
                    state.trial_outstanding,
                )
            )

    # ------------------------------------------------------------------ finish

    def finish(self, out: ReportBuilder) -> None:
        if not self.call_count and not self.trial_count:
            out.section("gateway", {"calls": 0})
            return
        for name, detail in (
            ("gateway_tokens", "every call's tokens follow the convention"),
            ("gateway_allowlist", "every allow/deny decision matches the exact allow-list"),
            ("gateway_budget", "every budget decision matches the re-derived token budget"),
            ("gateway_cap", "settled target tokens within the cap"),
            ("gateway_trial_totals", "every trial's tokens equal the sum of its calls"),
            ("gateway_optimizer_cap", "settled optimizer tokens within the optimizer's cap"),
        ):
            out.declare(name, detail)
        self._call_failures.emit(out)
        self._check_budget(out)
        optimizer = self._optimizer[4]
        if optimizer > self.optimizer_cap:
            out.fail(
                None,
                "GatewayCall",
                f"settled optimizer tokens {optimizer} exceed the optimizer's cap "
                f"{self.optimizer_cap}",
                check="gateway_optimizer_cap",
            )
        else:
            out.check(
                "gateway_optimizer_cap",
                True,
                f"{optimizer} of {self.optimizer_cap} optimizer tokens settled",
            )
        self._check_trials(out)
        self._section(out)

    def _check_budget(self, out: ReportBuilder) -> None:
        self._budget_failures.emit(out)
        m = len(self._s_index)
        seen = bytearray(m)
        for index in self._s_index:
            if index >= m or seen[index]:
                out.fail(
                    None,
                    "GatewayCall",
                    "reservation indices are not 0..M-1 once each "
                    "(a call is missing or duplicated)",
                    check="gateway_budget",
                )
                return
            seen[index] = 1
        del seen
        self._check_decisions(out)
        total = self._settled_total
        if total > self.cap:
            out.fail(
                None,
                "GatewayCall",
                f"settled target tokens {total} exceed the cap {self.cap}",
                check="gateway_cap",
            )
        else:
            out.check("gateway_cap", True, f"{total} of {self.cap} target tokens settled")

    def _check_decisions(self, out: ReportBuilder) -> None:
        s_index, s_reserved, s_total = self._s_index, self._s_reserved, self._s_total
        m = len(s_index)
        wide = max(self._reserved_total, self._settled_total) > INT64_MAX
        reserved_before = _zeros(m + 1, wide)
        for index, reserved in zip(s_index, s_reserved, strict=True):
            reserved_before[index + 1] = reserved
        for i in range(m):
            reserved_before[i + 1] += reserved_before[i]
        settled_before = _zeros(m + 1, wide)
        for i, total in enumerate(s_total):
            settled_before[i + 1] = settled_before[i] + total
        # Each trial's settlements, as positions in ledger order (rows[starts[c]:starts[c+1]]).
        trials = len(self._trial_codes)
        starts = _counts(trials + 1, m)
        for code in self._s_trial:
            starts[code + 1] += 1
        for c in range(trials):
            starts[c + 1] += starts[c]
        fill = array(starts.typecode, starts)
        rows = _counts(m, m)
        for position, code in enumerate(self._s_trial):
            rows[fill[code]] = position
            fill[code] += 1
        del fill
        # Outstanding at (n, r) = reservations with index < r not settled among the first n
        # settlements: answered offline, sweeping the settlements in ledger order.
        fenwick = _Fenwick(m, wide)
        swept = 0
        state = self._d_state
        for i in self._by_settled_calls(m):
            base = i * _STATE_STRIDE
            n, r = state[base + 2], state[base + 3]
            seq = self._d_seq[i]
            if n > m or r > m or n > r:
                out.fail(
                    seq, "GatewayCall", "budget state counts are impossible", check="gateway_budget"
                )
                continue
            while swept < n:
                fenwick.add(s_index[swept], s_reserved[swept])
                swept += 1
            trial = self._d_trial[i]
            trial_settled = trial_outstanding = 0
            for j in range(starts[trial], starts[trial + 1]):
                position = rows[j]
                if position < n:
                    trial_settled += s_total[position]
                elif s_index[position] < r:
                    trial_outstanding += s_reserved[position]
            cap, trial_cap = self._d_caps.get(i, (self.cap, self.trial_cap))
            recorded = _State(
                cap,
                state[base],
                state[base + 1],
                n,
                r,
                trial_cap,
                state[base + 4],
                state[base + 5],
            )
            derived = _State(
                self.cap,
                settled_before[n],
                reserved_before[r] - fenwick.prefix(r),
                n,
                r,
                self.trial_cap,
                trial_settled,
                trial_outstanding,
            )
            self._check_one(out, i, recorded, derived)

    def _by_settled_calls(self, m: int) -> chain[int]:
        """Decision numbers sorted (stably) by their recorded settled_calls."""
        state = self._d_state
        k = len(self._d_seq)
        starts = _counts(m + 2, k)
        late: list[int] = []
        for i in range(k):
            n = state[i * _STATE_STRIDE + 2]
            if n > m:
                late.append(i)
            else:
                starts[n + 1] += 1
        for n in range(m + 1):
            starts[n + 1] += starts[n]
        order = _counts(k - len(late), k)
        for i in range(k):
            n = state[i * _STATE_STRIDE + 2]
            if n <= m:
                order[starts[n]] = i
                starts[n] += 1
        late.sort(key=lambda i: state[i * _STATE_STRIDE + 2])
        return chain(order, late)

    def _check_one(self, out: ReportBuilder, i: int, recorded: _State, derived: _State) -> None:
        seq = self._d_seq[i]
        if recorded != derived:
            out.fail(
                seq,
                "GatewayCall",
                f"recorded budget state {_brief(recorded)} differs from the re-derived "
                f"{_brief(derived)}",
                check="gateway_budget",
            )
            return
        index = self._d_index[i]
        if index >= 0 and index != recorded.reservations:
            out.fail(seq, "GatewayCall", "reservation index out of order", check="gateway_budget")
        reserved = self._d_reserved[i]
        allowed = bool(self._d_allowed[i])
        denial = budget_denial(derived.model(), reserved)
        if allowed and denial is not None:
            out.fail(
                seq,
                "GatewayCall",
                f"allowed over the {denial} cap: reserving {reserved} with {_brief(derived)}",
                check="gateway_budget",
            )
        if not allowed and denial is None:
            out.fail(
                seq, "GatewayCall", "denied although it fits the budget", check="gateway_budget"
            )

    def _check_trials(self, out: ReportBuilder) -> None:
        completed, sums = self._completed, self._trial_sums
        names: list[str] | None = None
        for base in range(0, len(completed), _COMPLETED_STRIDE):
            seq, code = completed[base], completed[base + 1]
            reported = tuple(completed[base + 2 : base + 8])
            calls = completed[base + 8]
            at = code * _TRIAL_STRIDE
            expected = tuple(sums[at : at + 6])
            count = sums[at + 6]
            if reported != expected or calls != count:
                names = names or list(self._trial_codes)
                out.fail(
                    seq,
                    "TrialCompleted",
                    f"trial {names[code]} reports {reported[4]} tokens in "
                    f"{calls} calls; its GatewayCalls sum to {expected[4]} in "
                    f"{count}",
                    check="gateway_trial_totals",
                )

    def _section(self, out: ReportBuilder) -> None:
        out.section(
            "gateway",
            {
                "calls": self.call_count,
                "target_cap": self.cap,
                "per_trial_cap": self.trial_cap,
                "target_tokens": _usage(self._target, self._cache_write["target"]),
                "target_settled": self._settled_total,
                "overshoot": max(0, self._settled_total - self.cap),
                "estimated_calls": self._estimated,
                "optimizer_cap": self.optimizer_cap,
                "optimizer_tokens": _usage(self._optimizer, self._cache_write["optimizer"]),
                "denied": dict(sorted(self._denied.items())),
                "trials_checked": self.trial_count,
            },
        )


def _usage(sums: list[int], cache_write: int = 0) -> dict[str, int]:
    """Token sums in TokenUsage's fields, as plain integers: a sum over a forged log may
    leave the range one event can hold, and replay reports it exactly instead of failing."""
    inp, cached, output, reasoning, total = sums
    return {
        "input": inp,
        "cached": cached,
        "cache_write": cache_write,
        "output": output,
        "reasoning": reasoning,
        "total": total,
    }


def _brief(state: _State) -> str:
    text = f"settled {state.settled} + outstanding {state.outstanding} of {state.cap}"
    if state.trial_cap is not None:
        text += f", trial {state.trial_settled} + {state.trial_outstanding} of {state.trial_cap}"
    return text
