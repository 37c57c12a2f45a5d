"""Incidents: one problem seen across runs (and agents), published on the
incident topic keyed by fingerprint (a tenant's prefixed with its name, as
its run keys are); and the fleet stage's stored tally."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

IncidentStatus = Literal["open", "update"]
Scope = Literal["agent", "fleet"]

MAX_AGENT_IDS = 20
"""Agent ids listed in an incident (the count `agents` is exact up to the run cap)."""
MAX_SAMPLE_RUNS = 5
"""Run ids listed in an incident, the first counted."""


class Incident(Struct, kw_only=True):
    """Distinct runs blocked or aborted on the same fingerprint within one
    event-time window, published when they reach `minRuns` ("open") and each
    time they double ("update"). A fingerprint is counted per tenant: two
    tenants' verdicts never meet. Consumers deduplicate by
    `(tenant, fingerprint, window_start, status, runs)`: a restarted stage may
    publish a record again, always identical."""

    fingerprint: str
    """The verdict's `warning_key`, else `detector:tool_name`."""
    detector: str
    tool_name: str
    window_start: int
    """Seconds since the epoch; the window holds `window_start <= t < window_end`."""
    window_end: int
    status: IncidentStatus
    runs: int
    """Distinct runs counted in the window (stops at the stage's run cap)."""
    agents: int
    """Distinct named agents among them (runs without an agent_id add none)."""
    agent_ids: list[str]
    sample_run_ids: list[str]
    first_ts: float
    """Earliest and latest event time (seconds) among the counted verdicts (each run's first in the window)."""
    last_ts: float
    scope: Scope
    """"agent" when one agent accounts for every named run (a cron or heartbeat agent looping), else "fleet"."""
    message: str | None
    """The first counted verdict's message."""
    tenant: str | None = None
    """The tenant whose decisions topic the verdicts came from (`loopwarden.NAME.decisions`);
    None for the default pair. Last and defaulted, so records written before tenants decode."""


class WindowTally(Struct, array_like=True, kw_only=True):
    """One fingerprint's window as the stage keeps it: the distinct runs and
    agents as 64-bit hashes (a bounded, small value), the samples it reports,
    and the count it last published (0: none yet)."""

    start: int
    runs: list[int] = field(default_factory=list)
    agents: list[int] = field(default_factory=list)
    agent_ids: list[str] = field(default_factory=list)
    sample_run_ids: list[str] = field(default_factory=list)
    first_ts: float = 0.0
    last_ts: float = 0.0
    detector: str = ""
    tool_name: str = ""
    message: str | None = None
    published: int = 0


class FingerprintTally(Struct, array_like=True):
    """Everything the stage keeps for one fingerprint: its open windows, and
    the wall-clock time it last changed (first, as in a stored run, so the
    runs table's idle sweep expires fingerprints too)."""

    touched: float
    windows: list[WindowTally]
