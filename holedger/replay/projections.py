"""The registry of replay projections: each re-derives one aspect of a run.

A projection is built per replayed run from a ReplayContext, sees every verified event
in order (``apply``) and reports named checks, failures and a section (``finish``).
Rooms add theirs by appending a factory to PROJECTIONS.
"""

from __future__ import annotations

from holedger.replay.baseline import BaselineProjection
from holedger.replay.budget import BudgetProjection
from holedger.replay.disclosure import DisclosureProjection
from holedger.replay.engine import ProjectionFactory
from holedger.replay.leakage import LeakageProjection
from holedger.replay.protocol import ProtocolProjection
from holedger.replay.rescore import RescoreProjection
from holedger.replay.safety import SafetyProjection
from holedger.replay.scores import ScoresProjection

PROJECTIONS: list[ProjectionFactory] = [SafetyProjection]
PROJECTIONS += [
    ProtocolProjection,
    BudgetProjection,
    DisclosureProjection,
    ScoresProjection,
    BaselineProjection,
    RescoreProjection,
    LeakageProjection,
]

from holedger.replay.gateway_checks import GatewayProjection  # noqa: E402

PROJECTIONS.append(GatewayProjection)
