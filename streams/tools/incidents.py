"""`loopwarden incidents`: the incidents the fleet stage would publish for a
trace, recomputed offline from its events (replay, then the same aggregation)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import BinaryIO

from schemas.codec import encode_incident
from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from streams.fleet.incidents import IncidentSettings, incidents
from streams.tools.replay import Refusals, decide


def print_incidents(
    lines: Iterable[bytes],
    config: FleetConfig,
    out: BinaryIO,
    refusals: Refusals,
    settings: IncidentSettings,
    clock: Callable[[], float],
    policy: FleetPolicy | None = None,
    tenant: str | None = None,
) -> int:
    """One JSON incident per line, in the order the verdicts behind them are
    decided, as the stage publishes them for events of `tenant`; return how many. `refusals` reports the lines refused and counts
    what was read and decided."""
    written = 0
    for incident in incidents(decide(lines, config, refusals, policy), settings, clock, tenant):
        out.write(encode_incident(incident) + b"\n")
        written += 1
    out.flush()
    return written
