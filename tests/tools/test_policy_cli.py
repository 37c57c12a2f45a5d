"""`--policy FILE` / LOOPWARDEN_POLICY for replay and explain, run as the operator runs them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from builders import run_cli
from streams.cli import build_parser
from streams.tools.explain import main as explain_main

LOW = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}}}
ENOENT = {"content": [{"type": "text", "text": "ENOENT: no such file"}]}


def ping_pong_story(turns: int) -> list[dict[str, Any]]:
    """A model alternating two failing reads, and a gateway that answers every
    call, blocked ones too, with a result: each block is escaped by the next call."""
    events, seq = [], 0
    for turn in range(turns):
        call_id = f"c{turn}"
        args = {"path": "ab"[turn % 2]}
        events.append(
            {"type": "tool_call", "run_id": "r", "seq": seq, "tool_call_id": call_id, "tool_name": "read", "args": args}
        )
        events.append(
            {
                "type": "tool_result",
                "run_id": "r",
                "seq": seq + 1,
                "tool_call_id": call_id,
                "tool_name": "read",
                "args": args,
                "result": ENOENT,
            }
        )
        seq += 2
    return events


def write(path: Path, value: Any) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


def verdicts(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_a_bad_policy_exits_2_naming_the_file_and_path_before_reading_events(tmp_path: Path) -> None:
    bad = write(tmp_path / "policy.json5", "{agents: {'cheap-model': {escalation: {window: 2}}}}")
    events = "\n".join(json.dumps(e) for e in ping_pong_story(3)).encode()
    done = run_cli("--policy", str(bad), "-", stdin=events)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode() == (
        f"loopwarden: policy error: {bad}: agents.cheap-model.escalation.window: "
        "must be at least blockedCalls (3), got 2\n"
    )
    by_env = run_cli("-", stdin=events, LOOPWARDEN_POLICY=str(bad))
    assert by_env.returncode == 2 and b"agents.cheap-model.escalation.window" in by_env.stderr


def test_replay_ends_the_ping_pong_that_keeps_being_blocked(tmp_path: Path) -> None:
    """A gateway that runs even the blocked calls: recovery (on by default)
    ends the run at the call after the block. Without recovery the latch keeps
    the loop blocked, and escalation ends it at the third block."""
    config = write(tmp_path / "gateway.json", LOW)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(e) for e in ping_pong_story(20)) + "\n", encoding="utf-8")
    plain = verdicts(run_cli("--config", str(config), str(trace)).stdout)
    assert [v["decision"] for v in plain[:6]] == ["allow", "allow", "warn", "allow", "block", "abort"]
    assert {(v["decision"], v["error"]) for v in plain[5:]} == {("abort", "loop_recovery_exhausted")}
    steady = write(tmp_path / "steady.json", {"recovery": {"enabled": False}})
    kept = verdicts(run_cli("--config", str(config), "--policy", str(steady), str(trace)).stdout)
    decisions = [v["decision"] for v in kept]
    assert decisions[:5] == [v["decision"] for v in plain[:5]] and decisions[4:] == ["block"] * 16
    policy = write(tmp_path / "policy.json", {"recovery": {"enabled": False}, "escalation": {"enabled": True}})
    done = run_cli("--config", str(config), "--policy", str(policy), str(trace))
    assert done.returncode == 0, done.stderr
    got = verdicts(done.stdout)
    assert [v["decision"] for v in got[:6]] == decisions[:6]
    ended = got[6]
    assert (ended["detector"], ended["error"], ended["count"], ended["shadow_decision"]) == (
        "blocks_ignored",
        "blocks_ignored",
        3,
        None,
    )
    assert {(v["decision"], v["detector"]) for v in got[6:]} == {("abort", "blocks_ignored")}
    assert len(got) == 20  # one verdict per call: results of an ended run get none


def test_explain_shows_the_mode_the_budget_count_and_escalation_memory(tmp_path: Path) -> None:
    config = write(tmp_path / "gateway.json", LOW)
    policy = write(
        tmp_path / "policy.json",
        {
            "mode": "shadow",
            "recovery": {"enabled": False},
            "escalation": {"enabled": True, "blockedCalls": 2, "window": 4},
            "budget": {"maxToolCalls": 9},
        },
    )
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(e) for e in ping_pong_story(10)) + "\n", encoding="utf-8")
    out = io.StringIO()
    args = build_parser().parse_args(
        ["explain", "r", "--events", str(trace), "--config", str(config), "--policy", str(policy)]
    )
    assert explain_main(args, out, io.StringIO()) == 0
    text = out.getvalue()
    assert "policy: mode shadow; recovery off; budget 9 tool calls; escalation at 2 blocked of the last 4 calls" in text
    assert "allow [shadow: BLOCK] ping_pong" in text
    assert "allow [shadow: ABORT] blocks_ignored" in text
    assert "allow [shadow: ABORT] tool_call_budget" in text
    assert "policy: call 5/9 escalation [....X]" not in text  # at most `window` entries
    assert "policy: call 5/9 escalation [...X]" in text
    assert "shadow mode: enforcing would have warned 1, blocked" in text
