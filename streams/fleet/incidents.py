"""Verdicts in, incidents out: the one aggregation both the Faust stage and
`loopwarden incidents` run.

Pure, like the engine: the caller passes the processing time (used for a
verdict without `ts`, and as the tally's `touched`), and the tally passed in
is updated in place and returned. Per tenant and fingerprint, the same
verdicts in the same order give the same incidents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, UTC
from hashlib import blake2b

from msgspec import Struct

from schemas.incidents import MAX_AGENT_IDS, MAX_SAMPLE_RUNS, FingerprintTally, Incident, IncidentStatus, WindowTally
from schemas.verdicts import Verdict

COUNTED = ("block", "abort")


class IncidentSettings(Struct, frozen=True, kw_only=True):
    """How verdicts are windowed and when a window becomes an incident."""

    window: int = 900
    """Tumbling window length, in seconds of event time."""
    min_runs: int = 5
    """Distinct runs that open an incident; it is updated each time they double."""
    max_runs: int = 1000
    """Cap on the distinct runs a window keeps: its count stops there, with a last update."""
    lateness: int = 900
    """A window takes verdicts until the fingerprint has seen a window starting this long after its end."""

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_runs < 1 or self.lateness < 0:
            raise ValueError("window and minRuns must be positive and lateness not negative")
        if self.max_runs < self.min_runs:
            raise ValueError(f"the run cap ({self.max_runs}) must be at least minRuns ({self.min_runs})")


class Counted(Struct):
    """What one verdict did to its fingerprint's tally: the tally (None when it
    changed nothing, so nothing needs storing) and the incidents to publish."""

    tally: FingerprintTally | None
    incidents: list[Incident]


UNCHANGED = Counted(None, [])


def fingerprint(verdict: Verdict) -> str | None:
    """The problem a block or abort names across runs; None for other verdicts."""
    if verdict.decision not in COUNTED:
        return None
    return verdict.warning_key or f"{verdict.detector}:{verdict.tool_name}"


def event_time(ts: float | str | None) -> float | None:
    """Seconds since the epoch from an event's `ts` (a number, or RFC 3339;
    one without an offset is taken as UTC); None when absent or unreadable."""
    if ts is None:
        return None
    if isinstance(ts, (int, float)):
        return float(ts) if math.isfinite(ts) else None
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _hash(text: str) -> int:
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def count(
    tally: FingerprintTally | None,
    verdict: Verdict,
    key: str,
    now: float,
    settings: IncidentSettings,
    tenant: str | None = None,
) -> Counted:
    """Count `verdict` (a block or abort of `tenant` whose fingerprint is `key`)
    into its window, in `tenant`'s tally; publish when the window's distinct runs reach `min_runs`, double,
    or reach the cap. A run already counted, a full window, or a window
    already closed (later than `lateness`) changes nothing."""
    moment = event_time(verdict.ts)
    if moment is None:
        moment = now
    size = settings.window
    start = math.floor(moment / size) * size
    if tally is None:
        tally = FingerprintTally(now, [])
    windows = tally.windows
    newest = max(start, windows[-1].start) if windows else start
    if start + size + settings.lateness <= newest:
        return UNCHANGED  # its window has closed
    run = _hash(verdict.run_id)
    window = next((w for w in windows if w.start == start), None)
    if window is None:
        window = WindowTally(start=start, first_ts=moment, last_ts=moment)
        window.detector, window.tool_name, window.message = verdict.detector or "", verdict.tool_name, verdict.message
        windows.append(window)
        windows.sort(key=_start)
    elif run in window.runs or len(window.runs) >= settings.max_runs:
        return UNCHANGED
    window.runs.append(run)
    agent = verdict.agent_id
    if agent is not None:
        hashed = _hash(agent)
        if hashed not in window.agents:
            window.agents.append(hashed)
            if len(window.agent_ids) < MAX_AGENT_IDS:
                window.agent_ids.append(agent)
    if len(window.sample_run_ids) < MAX_SAMPLE_RUNS:
        window.sample_run_ids.append(verdict.run_id)
    window.first_ts = min(window.first_ts, moment)
    window.last_ts = max(window.last_ts, moment)
    tally.windows = [w for w in windows if w.start + size + settings.lateness > windows[-1].start]
    runs = len(window.runs)
    due = runs >= settings.min_runs and (
        not window.published or runs >= 2 * window.published or runs == settings.max_runs
    )
    if not due:
        return _stored(tally, now, [])
    incident = _incident(key, window, size, "update" if window.published else "open", tenant)
    window.published = runs
    return _stored(tally, now, [incident])


def _start(window: WindowTally) -> int:
    return window.start


def _stored(tally: FingerprintTally, now: float, incidents: list[Incident]) -> Counted:
    tally.touched = now
    return Counted(tally, incidents)


def _incident(key: str, window: WindowTally, size: int, status: IncidentStatus, tenant: str | None) -> Incident:
    agents = len(window.agents)
    return Incident(
        fingerprint=key,
        detector=window.detector,
        tool_name=window.tool_name,
        window_start=window.start,
        window_end=window.start + size,
        status=status,
        runs=len(window.runs),
        agents=agents,
        agent_ids=list(window.agent_ids),
        sample_run_ids=list(window.sample_run_ids),
        first_ts=window.first_ts,
        last_ts=window.last_ts,
        scope="agent" if agents == 1 else "fleet",
        message=window.message,
        tenant=tenant,
    )


def incidents(
    verdicts: Iterable[Verdict], settings: IncidentSettings, clock: Callable[[], float], tenant: str | None = None
) -> Iterator[Incident]:
    """Every incident the stage would publish for these verdicts of `tenant`
    (read from its decisions topic), in the order they are decided (`clock` is
    the processing time of a verdict without `ts`)."""
    tallies: dict[str, FingerprintTally] = {}
    for verdict in verdicts:
        key = fingerprint(verdict)
        if key is None:
            continue
        counted = count(tallies.get(key), verdict, key, clock(), settings, tenant)
        if counted.tally is not None:
            tallies[key] = counted.tally
        yield from counted.incidents
