"""The replay checks, registered here and nowhere else: each re-derives one aspect of a run.

Each check is a fold: built per replayed run from a ReplayContext whose inputs are a
CheckInputs (holedger.replay.inputs), sees every verified event in order (``apply``) and
reports named checks, failures and a section (``finish``). Rooms add theirs by appending
a factory to CHECKS.
"""

from __future__ import annotations

from holedger.replay.checks.baseline import BaselineFold
from holedger.replay.checks.budget import BudgetFold
from holedger.replay.checks.disclosure import DisclosureFold
from holedger.replay.checks.leakage import LeakageFold
from holedger.replay.checks.order import OrderFold
from holedger.replay.checks.reads import ReadsFold
from holedger.replay.checks.rescore import RescoreFold
from holedger.replay.checks.rescoring import RescoringFold
from holedger.replay.checks.safety import SafetyFold
from holedger.replay.checks.scores import ScoresFold
from holedger.replay.inputs import CheckFactory

CHECKS: list[CheckFactory] = [SafetyFold]
CHECKS += [
    OrderFold,
    BudgetFold,
    DisclosureFold,
    ScoresFold,
    BaselineFold,
    RescoreFold,
    LeakageFold,
    ReadsFold,
    RescoringFold,
]

from holedger.replay.checks.gateway import GatewayFold  # noqa: E402

CHECKS.append(GatewayFold)

from holedger.replay.checks.audit_controls import AuditControlsFold  # noqa: E402

CHECKS.append(AuditControlsFold)

from holedger.replay.checks.control_run import ControlRunFold  # noqa: E402

CHECKS.append(ControlRunFold)

from holedger.replay.checks.evolve import EvolveFold  # noqa: E402

CHECKS.append(EvolveFold)

from holedger.replay.checks.roles import RolesFold  # noqa: E402

CHECKS.append(RolesFold)
