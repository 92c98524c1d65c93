"""What a home already holds, asked before ``holedger init`` makes a key.

A home whose key file is gone but whose runs are still there must not quietly get a new
operator identity: every run signed by the old key would then fail ``--trusted-key``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from holedger.config import Settings
from holedger.errors import ConfigError, HoledgerError
from holedger.schemas.events import RunOpened


class HomeLedger(Protocol):
    """What a home's check reads of a ledger; the store's ``Ledger`` is one."""

    def run_ids(self) -> list[str]: ...
    def run_terms(self, run_id: str) -> RunOpened: ...
    def close(self) -> None: ...


# Opens a ledger URL without creating tables (given by the store: no import of it here).
OpenLedger = Callable[[str], HomeLedger]


def _own_ledger(settings: Settings) -> bool:
    """Whether the ledger is the home's own SQLite file (every run in it is the home's)."""
    prefix = "sqlite:///"
    if not settings.ledger_url.startswith(prefix):
        return False
    path = Path(settings.ledger_url[len(prefix) :].split("?", 1)[0])
    return path.resolve().is_relative_to(settings.home.resolve())


def _ledger_exists(settings: Settings) -> bool:
    prefix = "sqlite:///"
    if settings.ledger_url.startswith(prefix):
        path = Path(settings.ledger_url[len(prefix) :].split("?", 1)[0])
        return path.is_file() and path.stat().st_size > 0
    return True


def home_runs(settings: Settings, open_ledger: OpenLedger) -> tuple[list[str], Counter[str]]:
    """The runs of this home (its run repositories, and every run of a ledger file inside
    the home), and how many of them each signing key signed, by "name key id".

    Runs of a shared ledger (PostgreSQL) count only when this home holds their
    repository: other homes may write to the same database with keys of their own."""
    repos = sorted(p.name.removesuffix(".git") for p in settings.runs_dir.glob("*.git"))
    runs: set[str] = set(repos)
    signers: Counter[str] = Counter()
    if not _ledger_exists(settings):
        return sorted(runs), signers
    try:
        ledger = open_ledger(settings.ledger_url)
    except HoledgerError:
        if runs or _own_ledger(settings):
            raise
        return [], signers
    try:
        known = set(ledger.run_ids())
        if _own_ledger(settings):
            runs |= known
        for run_id in sorted(runs & known):
            with contextlib.suppress(HoledgerError):
                keys = ledger.run_terms(run_id).keys.values()
                for who in sorted({f"{k.name} key id {k.key_id}" for k in keys}):
                    signers[who] += 1
    finally:
        ledger.close()
    return sorted(runs), signers


def refuse_emptied_ledger(settings: Settings) -> None:
    """Refuse an empty ledger file in a home that has run repositories: SQLite would open
    it as a new, empty ledger, and the runs would silently vanish from every listing."""
    prefix = "sqlite:///"
    if not settings.ledger_url.startswith(prefix):
        return
    path = Path(settings.ledger_url[len(prefix) :].split("?", 1)[0])
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return
    repos = list(settings.runs_dir.glob("*.git")) if empty else []
    if repos:
        raise ConfigError(
            f"the ledger file {path} is empty, but the home has {len(repos)} run "
            f"repositor{'ies' if len(repos) != 1 else 'y'}: the ledger was truncated",
            hint="restore it from a backup, or start a new home elsewhere with "
            "'holedger --home NEW_DIR init'",
        )


def refuse_lost_key(settings: Settings, open_ledger: OpenLedger) -> None:
    """Refuse to make a key for a home that has runs: they were signed by a key that is
    gone, and a new one would silently replace its identity."""
    runs, signers = home_runs(settings, open_ledger)
    if not runs:
        return
    by = ", ".join(
        who if len(signers) == 1 else f"{who} ({n} run{'s' if n != 1 else ''})"
        for who, n in signers.items()
    )
    by = by or "a key this home no longer names"
    pub = ""
    with contextlib.suppress(OSError):
        text = settings.pub_path.read_text().strip()
        if text:
            pub = f"; {settings.pub_path} still holds the verifier key {text}"
    raise ConfigError(
        f"the home {settings.home} has {len(runs)} run{'s' if len(runs) != 1 else ''} "
        f"signed by {by}, but its key file {settings.key_path} is gone{pub}; "
        "a new key would make every one of them fail --trusted-key",
        hint=f"restore that key file from a backup to {settings.key_path} (mode 0600), "
        "or start a new home elsewhere with 'holedger --home NEW_DIR init'",
    )
