"""Bearer tokens: one capability per trial, or per run for the optimizer scope.

A token is 32 random bytes (``hlg_`` + URL-safe base64). Only its SHA-256 is stored, in
the ``holedger_gateway_tokens`` table of the ledger database, so ``holedger token`` in one
process and the gateway in another agree. A presented token is hashed, looked up by its
hash and compared with ``hmac.compare_digest``. A trial token dies when its trial ends
(:meth:`TokenRegistry.revoke_trial`) or when it expires; every token of a run dies when
the run closes (ledger.closing marks it; a token's claims carry the mark), and no token
is issued for a closed run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.sql.elements import ColumnElement

from holedger.errors import RunClosedError, UsageError
from holedger.ledger import closing

log = logging.getLogger("holedger.gateway")
TOKEN_PREFIX = "hlg_"
DEFAULT_TRIAL_TTL_S = 24 * 3600
Scope = Literal["target", "optimizer"]
TokenState = Literal["live", "expired", "revoked"]

_metadata = MetaData()
tokens_table = Table(
    "holedger_gateway_tokens",
    _metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("run_id", String(36), nullable=False, index=True),
    Column("scope", String(16), nullable=False),
    Column("request_id", String(128)),
    Column("trial_id", String(128), index=True),
    Column("case_id", String(256)),
    Column("attempt", Integer),
    Column("issued_at", Integer, nullable=False),
    Column("expires_at", Integer),
    Column("revoked", Boolean, nullable=False, default=False),
)


@dataclass(frozen=True)
class TokenClaims:
    """What a token grants: the attribution of every call made with it."""

    run_id: str
    scope: Scope
    request_id: str | None = None
    trial_id: str | None = None
    case_id: str | None = None
    attempt: int | None = None
    expires_at: int | None = None
    revoked: bool = False
    run_closed: bool = False  # its run has closed: the token is dead with it

    def state(self, now: float | None = None) -> TokenState:
        if self.revoked or self.run_closed:
            return "revoked"
        if self.expires_at is not None and (now or time.time()) >= self.expires_at:
            return "expired"
        return "live"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    raw = secrets.token_bytes(32)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


class TokenRegistry:
    """Issue, look up and revoke tokens; a small read-through cache keeps lookups cheap.

    The cache holds claims by token hash. A revocation through this registry takes effect
    at once: it drops the trial's entries, and a database read that was under way while
    it happened is not cached. Entries are good for ``cache_ttl_s`` so a revocation made
    by another process is seen within that time; an entry in use is re-read in the
    background once half of that has passed, so lookups on the request path do not wait
    for the database.
    """

    def __init__(
        self, engine: Engine, *, cache_ttl_s: float = closing.CLOSE_VISIBLE_WITHIN_S
    ) -> None:
        self.engine = engine
        # A close waits this long for other processes' gateways (ledger.closing): no more.
        self.cache_ttl_s = min(cache_ttl_s, closing.CLOSE_VISIBLE_WITHIN_S)
        _metadata.create_all(engine, checkfirst=True)
        closing.create_tables(engine)
        self._cache: dict[str, tuple[float, TokenClaims | None]] = {}
        self._lock = threading.Lock()
        self._revocations = 0  # counts revocations, so a read that overlapped one is dropped
        self._refreshing: set[str] = set()
        self._refresher: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ issuing

    def issue_trial_token(
        self,
        run_id: str,
        *,
        request_id: str,
        trial_id: str,
        case_id: str,
        attempt: int,
        ttl_s: int | None = DEFAULT_TRIAL_TTL_S,
    ) -> str:
        """A token for one trial of ``run_id`` (scope "target"); dies with the trial."""
        if not trial_id:
            raise UsageError("a trial token needs a trial id")
        expires = int(time.time()) + ttl_s if ttl_s is not None else None
        claims = TokenClaims(
            run_id, "target", request_id, trial_id, case_id, attempt, expires_at=expires
        )
        return self._issue(claims)

    def issue_optimizer_token(self, run_id: str, *, ttl_s: int | None = None) -> str:
        """A token for the run's optimizer scope: metered and capped (its own cap)."""
        expires = int(time.time()) + ttl_s if ttl_s is not None else None
        return self._issue(TokenClaims(run_id, "optimizer", expires_at=expires))

    def _issue(self, claims: TokenClaims) -> str:
        if closing.is_marked_closed(self.engine, claims.run_id):
            raise RunClosedError(
                f"run {claims.run_id} is closed: its tokens died with it",
                hint="open a new run for more calls",
            )
        token = new_token()
        digest = token_hash(token)
        with self.engine.begin() as conn:
            conn.execute(
                tokens_table.insert().values(
                    token_hash=digest,
                    run_id=claims.run_id,
                    scope=claims.scope,
                    request_id=claims.request_id,
                    trial_id=claims.trial_id,
                    case_id=claims.case_id,
                    attempt=claims.attempt,
                    issued_at=int(time.time()),
                    expires_at=claims.expires_at,
                    revoked=False,
                )
            )
        with self._lock:
            self._cache[digest] = (time.monotonic(), claims)
        return token

    # ------------------------------------------------------------------ revoking

    def revoke(self, token: str) -> None:
        """Kill one token."""
        digest = token_hash(token)
        with self.engine.begin() as conn:
            conn.execute(
                update(tokens_table).where(tokens_table.c.token_hash == digest).values(revoked=True)
            )
        with self._lock:
            self._revocations += 1
            self._cache.pop(digest, None)

    def forget_run(self, run_id: str) -> None:
        """Drop the cached claims of ``run_id``'s tokens (its run has closed: they are
        read again, with the close)."""
        with self._lock:
            self._revocations += 1
            stale = [k for k, (_, c) in self._cache.items() if c is not None and c.run_id == run_id]
            for key in stale:
                self._cache.pop(key, None)

    def revoke_trial(self, run_id: str, trial_id: str) -> None:
        """Kill every token of a trial (called when the trial ends)."""
        self._revoke(run_id, tokens_table.c.trial_id == trial_id, lambda c: c.trial_id == trial_id)

    def revoke_request(self, run_id: str, request_id: str) -> None:
        """Kill every token of a request's trials (its trials were recorded unfinished)."""
        self._revoke(
            run_id, tokens_table.c.request_id == request_id, lambda c: c.request_id == request_id
        )

    def _revoke(
        self, run_id: str, where: ColumnElement[bool], match: Callable[[TokenClaims], bool]
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(tokens_table)
                .where(tokens_table.c.run_id == run_id, where)
                .values(revoked=True)
            )
        with self._lock:
            self._revocations += 1
            stale = [
                key
                for key, (_, claims) in self._cache.items()
                if claims is not None and claims.run_id == run_id and match(claims)
            ]
            for key in stale:
                self._cache.pop(key, None)

    # ------------------------------------------------------------------ lookup

    def lookup(self, token: str) -> TokenClaims | None:
        """The claims of ``token`` (live, expired or revoked), or None when unknown."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 128:
            return None
        digest = token_hash(token)
        hit = self._cache.get(digest)
        if hit is not None:
            age = time.monotonic() - hit[0]
            if age < self.cache_ttl_s:
                if age >= self.cache_ttl_s / 2:
                    self._refresh_soon(digest)
                return hit[1]
        return self._read(digest)

    def _read(self, digest: str) -> TokenClaims | None:
        """Read from the database and cache, unless a revocation happened meanwhile (the
        row read may predate it)."""
        with self._lock:
            revocations = self._revocations
        read_at = time.monotonic()
        claims = self._load(digest)
        with self._lock:
            if self._revocations == revocations:
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[digest] = (read_at, claims)
        return claims

    def _refresh_soon(self, digest: str) -> None:
        with self._lock:
            if digest in self._refreshing:
                return
            self._refreshing.add(digest)
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(1, thread_name_prefix="holedger-tokens")
            refresher = self._refresher
        refresher.submit(self._refresh, digest)

    def _refresh(self, digest: str) -> None:
        try:
            self._read(digest)
        except Exception as exc:  # the entry expires; the next lookup reads it itself
            log.warning("token refresh failed: %s: %s", type(exc).__name__, exc)
        finally:
            with self._lock:
                self._refreshing.discard(digest)

    def _load(self, digest: str) -> TokenClaims | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(tokens_table).where(tokens_table.c.token_hash == digest)
            ).first()
        if row is None:
            return None
        # The index lookup found the row; compare the full hash in constant time anyway.
        if not hmac.compare_digest(str(row.token_hash), digest):
            return None
        scope: Scope = "optimizer" if row.scope == "optimizer" else "target"
        closed = closing.is_marked_closed(self.engine, str(row.run_id))
        return TokenClaims(
            run_id=str(row.run_id),
            scope=scope,
            request_id=row.request_id,
            trial_id=row.trial_id,
            case_id=row.case_id,
            attempt=row.attempt,
            expires_at=row.expires_at,
            revoked=bool(row.revoked),
            run_closed=closed,
        )
