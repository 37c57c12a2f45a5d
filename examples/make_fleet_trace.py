"""Writes examples/fleet-trace.jsonl: a fleet's quarter hour with two
problems no single run shows. `python examples/make_fleet_trace.py`

- After a bad deploy, 24 runs of four agents call the orders API, which
  fails the same way every time, until each run is blocked (generic_repeat).
- A heartbeat agent starts a run every two minutes; every run calls a tool
  that no longer exists until it is blocked (unknown_tool_repeat).

Events carry `ts` (seconds since the epoch; the heartbeat's as RFC 3339) and
are written in time order, so the runs interleave as a real fleet's do.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

START = 1796187600  # 2026-12-02T05:00:00Z
AGENTS = ("support", "billing", "triage", "docs")
ORDERS = {"url": "https://orders.internal/api/v2/orders?status=open"}
OUTAGE = "503 Service Unavailable: upstream orders-api is not answering"


def run(run_id: str, agent: str, start: int, calls: int, tool: str, args: dict, error: str, rfc3339: bool) -> list:
    """(time, event) of `calls` identical failing calls, one every 3 s, and their results."""
    events = []
    for n in range(calls):
        moment = start + 3 * n
        call = {"type": "tool_call", "run_id": run_id, "seq": 2 * n + 1, "tool_call_id": f"call-{n}"}
        call |= {"tool_name": tool, "args": args, "agent_id": agent}
        result = {"type": "tool_result", "run_id": run_id, "seq": 2 * n + 2, "tool_call_id": f"call-{n}"}
        result |= {"tool_name": tool, "error": error}
        for event, at in ((call, moment), (result, moment + 1)):
            event["ts"] = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z") if rfc3339 else at
            events.append((at, event))
    return events


def fleet_trace() -> list[dict]:
    events = []
    for n in range(24):
        agent = AGENTS[n % len(AGENTS)]
        events += run(f"{agent}-{n:02d}", agent, START + 60 + 15 * n, 22, "http_get", ORDERS, OUTAGE, False)
    for n in range(6):
        error = "Unknown tool: send_digest"
        events += run(f"heartbeat-{n}", "heartbeat", START + 30 + 120 * n, 12, "send_digest", {}, error, True)
    return [event for _, event in sorted(events, key=lambda pair: (pair[0], pair[1]["run_id"]))]


def main() -> None:
    path = Path(__file__).with_name("fleet-trace.jsonl")
    path.write_text("".join(json.dumps(event) + "\n" for event in fleet_trace()))
    print(path)


if __name__ == "__main__":
    main()
