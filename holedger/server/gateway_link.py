"""The model gateway as the server runs it: in-process, one unix socket per trial.

For each trial the link issues a token for that trial alone, opens a unix socket on the
running gateway that accepts only that token (the sandbox relays a loopback port to it),
and when the trial ends revokes the token, waits for the trial's calls in flight and
returns their totals for TrialCompleted.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from holedger.config import Settings
from holedger.gateway.app import CallerBinding, Gateway, create_gateway_app
from holedger.gateway.config import GatewayConfig
from holedger.gateway.serve import AppServer, serve_gateway
from holedger.gateway.tokens import TokenRegistry
from holedger.ledger.store import Ledger
from holedger.server.trials import GatewayUsage, TrialAccess, TrialRef

GATEWAY_CONFIG_NAME = "gateway.toml"


def gateway_config(settings: Settings) -> GatewayConfig:
    """The home's gateway.toml when present, else the offline simulator upstream."""
    path = settings.home / GATEWAY_CONFIG_NAME
    return GatewayConfig.load(path) if path.exists() else GatewayConfig()


class GatewayLink:
    """A running gateway (an AppServer on a private unix socket) that trials call."""

    def __init__(
        self,
        ledger: Ledger,
        config: GatewayConfig | None = None,
        *,
        tokens: TokenRegistry | None = None,
        gateway: Gateway | None = None,
        server: AppServer | None = None,
    ) -> None:
        self.ledger = ledger
        self.tokens = tokens or TokenRegistry(ledger.app.engine)
        self._dir = Path(tempfile.mkdtemp(prefix="holedger-gw-"))
        self._dir.chmod(0o711)
        self._owned = server is None
        self.gateway = gateway or create_gateway_app(ledger, self.tokens, config)
        self.server = server or serve_gateway(
            self.gateway, host=None, port=None, uds=self._dir / "gateway.sock"
        )

    def close(self) -> None:
        if self._owned:
            self.server.stop()
            self.gateway.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    @contextlib.contextmanager
    def trial(self, plan: TrialRef) -> Iterator[TrialAccess]:
        token = self.tokens.issue_trial_token(
            plan.run_id,
            request_id=plan.request_id,
            trial_id=plan.trial_id,
            case_id=plan.case_id,
            attempt=plan.attempt,
        )
        sock_dir = Path(tempfile.mkdtemp(prefix="t-", dir=self._dir))
        sock_dir.chmod(0o755)
        path = sock_dir / "gw.sock"
        binding = CallerBinding(
            run_id=plan.run_id,
            scope="target",
            trial_id=plan.trial_id,
            request_id=plan.request_id,
            case_id=plan.case_id,
            attempt=plan.attempt,
        )
        self.server.bind_unix(path, binding)
        access = TrialAccess(token=token, socket=path)
        try:
            yield access
        finally:
            self.server.unbind_unix(path)
            usage = self.gateway.close_trial(plan.run_id, plan.trial_id)
            access.usage = GatewayUsage(usage.tokens, usage.calls, usage.failed)
            shutil.rmtree(sock_dir, ignore_errors=True)
