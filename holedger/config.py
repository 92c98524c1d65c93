"""Where things live: the holedger home and the ledger URL.

The home (``--home``, env ``HOLEDGER_HOME``, default ``./.holedger``) holds::

    keys/operator.key      the operator's Ed25519 signing key (mode 0600)
    keys/operator.pub      its verifier key text (C2SP vkey)
    ledger.db              the default SQLite ledger
    runs/<run_id>.git      each run's bare candidate repository
    reports/               HTML reports

The ledger URL (``--ledger``, env ``HOLEDGER_LEDGER``) defaults to the SQLite file in the
home; ``postgresql+psycopg://...`` selects PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_KEY_NAME = "holedger-operator"


@dataclass(frozen=True)
class Settings:
    home: Path
    ledger_url: str

    @classmethod
    def resolve(cls, home: str | Path, ledger_url: str | None = None) -> Settings:
        home_path = Path(home).expanduser().absolute()
        url = ledger_url or f"sqlite:///{home_path / 'ledger.db'}"
        return cls(home_path, url)

    @property
    def key_path(self) -> Path:
        return self.home / "keys" / "operator.key"

    @property
    def pub_path(self) -> Path:
        return self.home / "keys" / "operator.pub"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    def run_repo(self, run_id: str) -> Path:
        return self.runs_dir / f"{run_id}.git"
