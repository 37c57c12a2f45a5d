"""Writes examples/sample-trace.jsonl: six interleaved agent runs, one per kind of
loop, small enough to read. `python examples/make_sample_trace.py`"""

from __future__ import annotations

import itertools
import json
from pathlib import Path


def run(run_id: str, agent_id: str | None, steps: list[tuple]) -> list[dict]:
    """steps: ("call", tool, args, result|None, error|None) or ("compaction",) or ("end",)."""
    events: list[dict] = []
    seq = itertools.count(1)
    for n, step in enumerate(steps):
        if step[0] == "compaction":
            events.append({"type": "compaction", "run_id": run_id, "seq": next(seq)})
            continue
        if step[0] == "end":
            events.append({"type": "run_end", "run_id": run_id, "seq": next(seq)})
            continue
        _, tool, args, result, error = step
        call = {
            "type": "tool_call",
            "run_id": run_id,
            "seq": next(seq),
            "tool_call_id": f"call-{n}",
            "tool_name": tool,
            "args": args,
        }
        if agent_id and not events:
            call["agent_id"] = agent_id
        events.append(call)
        outcome = {
            "type": "tool_result",
            "run_id": run_id,
            "seq": next(seq),
            "tool_call_id": f"call-{n}",
            "tool_name": tool,
        }
        if error is not None:
            outcome["error"] = error
        else:
            outcome["result"] = result
        events.append(outcome)
    return events


def text(body: str) -> dict:
    return {"content": [{"type": "text", "text": body}]}


def main() -> None:
    missing = (
        "call",
        "read",
        {"path": "/repo/ROADMAP.md"},
        None,
        "ENOENT: no such file or directory, open '/repo/ROADMAP.md'",
    )
    poll = (
        "call",
        "process",
        {"action": "poll", "sessionId": "build-7"},
        {"details": {"status": "running", "aggregated": "compiling…"}, **text("still running")},
        None,
    )
    ping = ("call", "browser", {"action": "snapshot", "tab": 1}, text("<page unchanged>"), None)
    pong = ("call", "browser", {"action": "click", "ref": "e12"}, text("clicked"), None)
    unknown = ("call", "web_serch", {"q": "kafka partitions"}, None, "Unknown tool: web_serch")
    stuck_exec = (
        "call",
        "exec",
        {"command": "npm test"},
        {"details": {"status": "failed", "exitCode": 1, "aggregated": "1 failing", "durationMs": 913}},
        None,
    )
    healthy = [
        ("call", "read", {"path": "README.md"}, text("# demo"), None),
        (
            "call",
            "exec",
            {"command": "ls"},
            {"details": {"status": "completed", "exitCode": 0, "aggregated": "README.md\nsrc"}},
            None,
        ),
        ("call", "write", {"path": "notes.md", "content": "done"}, text("written"), None),
        ("end",),
    ]
    runs = [
        run("run-healthy", "main", healthy),
        run("run-repeat", "safe-runner", [missing] * 18 + [("end",)]),
        run("run-poll", None, [poll] * 12 + [("end",)]),
        run("run-pingpong", None, [ping, pong] * 11 + [("end",)]),
        run("run-unknown-tool", None, [unknown] * 11 + [("end",)]),
        run("run-compaction", None, [stuck_exec] * 2 + [("compaction",)] + [stuck_exec] * 4),
    ]
    lines = [json.dumps(event, ensure_ascii=False) for event in _interleave(runs)]
    Path(__file__).with_name("sample-trace.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _interleave(runs: list[list[dict]]):
    """Round-robin, as concurrent agents would publish: each run stays in order."""
    for batch in itertools.zip_longest(*runs):
        yield from (event for event in batch if event is not None)


if __name__ == "__main__":
    main()
