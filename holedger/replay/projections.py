"""The registry of replay projections: each re-derives one aspect of a run.

A projection is built per replayed run from a ReplayContext, sees every verified event
in order (``apply``) and reports named checks, failures and a section (``finish``).
Rooms add theirs by appending a factory to PROJECTIONS.
"""

from __future__ import annotations

from holedger.replay.engine import ProjectionFactory
from holedger.replay.safety import SafetyProjection

PROJECTIONS: list[ProjectionFactory] = [SafetyProjection]
