"""`loopwarden incidents [--config F] EVENTS.jsonl|-`, run as a separate process."""

from __future__ import annotations

import json
from pathlib import Path

from builders import run_cli
from schemas.codec import decode_incident, decode_verdict
from streams.fleet.incidents import IncidentSettings, incidents

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"


def incidents_cli(*args: str, stdin: bytes | None = None):
    return run_cli(*args, stdin=stdin, command="incidents")


def test_the_fleet_trace_gives_a_fleet_incident_and_an_agent_incident():
    done = incidents_cli("--config", str(CONFIG), str(FLEET))
    assert done.returncode == 0, done.stderr
    found = [decode_incident(line) for line in done.stdout.splitlines()]
    outage = [i for i in found if i.tool_name == "http_get"]
    assert [(i.status, i.runs) for i in outage] == [("open", 5), ("update", 10), ("update", 20)]
    assert {(i.agents, i.scope) for i in outage} == {(4, "fleet")}
    (heartbeat,) = [i for i in found if i.tool_name == "send_digest"]
    assert (heartbeat.agent_ids, heartbeat.scope, heartbeat.runs) == (["heartbeat"], "agent", 5)
    # the replayed verdicts through the same aggregation: the command adds nothing of its own
    replayed = run_cli("--config", str(CONFIG), str(FLEET))
    verdicts = [decode_verdict(line) for line in replayed.stdout.splitlines()]
    assert found == list(incidents(verdicts, IncidentSettings(), clock=lambda: 0.0))
    assert incidents_cli("--config", str(CONFIG), str(FLEET)).stdout == done.stdout  # deterministic


def test_options_change_the_windows_and_thresholds():
    done = incidents_cli("--config", str(CONFIG), "--min-runs", "3", "--window", "5m", str(FLEET))
    found = [json.loads(line) for line in done.stdout.splitlines()]
    assert {i["window_end"] - i["window_start"] for i in found} == {300}
    assert min(i["runs"] for i in found) == 3


def test_verdicts_without_ts_take_now_and_bad_lines_are_named():
    events = [
        json.dumps({"type": "tool_call", "run_id": f"r{n}", "seq": s, "tool_call_id": f"c{s}", "tool_name": "nope"})
        + "\n"
        + json.dumps(
            {"type": "tool_result", "run_id": f"r{n}", "seq": s + 1, "tool_call_id": f"c{s}", "tool_name": "nope"}
            | {"error": "Unknown tool: nope"}
        )
        for n in range(2)
        for s in range(1, 24, 2)
    ]
    trace = ("\n".join(events) + "\nnot json\n").encode()
    done = incidents_cli("--config", str(CONFIG), "--min-runs", "2", "--now", "1796187650", "-", stdin=trace)
    assert done.returncode == 1
    assert "line 49: not a JSON event" in done.stderr.decode()
    (incident,) = [decode_incident(line) for line in done.stdout.splitlines()]
    assert (incident.window_start, incident.first_ts, incident.runs) == (1796187600, 1796187650.0, 2)


def test_settings_that_cannot_hold_exit_2_before_reading():
    done = incidents_cli("--min-runs", "8", "--max-runs", "4", "/nonexistent.jsonl")
    assert done.returncode == 2 and b"run cap (4) must be at least minRuns (8)" in done.stderr
    done = incidents_cli("--window", "1.5s", "-")
    assert done.returncode == 2 and b"expected whole seconds" in done.stderr
