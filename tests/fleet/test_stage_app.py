"""The fleet stage's Faust app, without a broker."""

from __future__ import annotations

from pathlib import Path

from helpers import queue_after_resumes
from streams.fleet.settings import FleetSettings
from streams.fleet.stage import create_fleet_app


def test_the_stage_keeps_the_verdicts_queued_when_its_flow_resumes_without_a_suspension(tmp_path: Path) -> None:
    """A restart that recovers the tallies resumes the flow, seeks to the
    committed offsets and resumes it again: what was fetched in between stays
    queued. Faust's own flow control empties the queues at every resume, and
    for a partition with no committed offset those verdicts were never
    fetched again (tests/fleet/test_stage.py, killed-uncommitted)."""
    app = create_fleet_app(FleetSettings(bootstrap="127.0.0.1:1", data_dir=tmp_path))
    assert queue_after_resumes(app.flow_control, suspend_between=False) == 1
    assert queue_after_resumes(app.flow_control, suspend_between=True) == 0
