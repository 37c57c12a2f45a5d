"""`loopwarden explain` from JSON lines: the timeline shows what each detector
measured, and its verdicts are the engine's own."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from schemas.config import FleetConfig, LoopDetectionConfig
from streams.cli import main as cli_main
from schemas.codec import decode_verdict
from schemas.configfile import load_config
from streams.tools.explain import explain, format_timeline, short, shorten_key
from streams.tools.replay import replay

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-trace.jsonl"
SAMPLE_CONFIG = ROOT / "examples" / "loopwarden.json5"

TIGHT = FleetConfig(
    default=LoopDetectionConfig(
        enabled=True, warning_threshold=3, critical_threshold=5, global_circuit_breaker_threshold=6
    )
)


def lines(events: list[dict]) -> list[tuple[str, bytes]]:
    return [(f"line {i}", json.dumps(e).encode()) for i, e in enumerate(events, 1)]


def looping_run(run: str = "r1") -> list[dict]:
    """exec with the same output 6 times, a bad tool 2 times, a compaction
    and 3 identical reads (abort), a duplicate and a run_end."""
    events: list[dict] = []
    seq = 0

    def add(kind: str, **fields) -> None:
        nonlocal seq
        events.append({"type": kind, "run_id": run, "seq": seq, **fields})
        seq += 1

    for i in range(6):
        add("tool_call", tool_call_id=f"e{i}", tool_name="exec", args={"command": "make"})
        add(
            "tool_result",
            tool_call_id=f"e{i}",
            tool_name="exec",
            result={"content": [{"type": "text", "text": "FAIL"}]},
        )
    for i in range(2):
        add("tool_call", tool_call_id=f"u{i}", tool_name="web_serch", args={"q": "x"})
        add("tool_result", tool_call_id=f"u{i}", tool_name="web_serch", error="Unknown tool: web_serch")
    add("compaction")
    for i in range(3):
        add("tool_call", tool_call_id=f"r{i}", tool_name="read", args={"path": "a"})
        add(
            "tool_result",
            tool_call_id=f"r{i}",
            tool_name="read",
            result={"content": [{"type": "text", "text": "same"}]},
        )
    events.append(dict(events[1]))  # a redelivered result: duplicate
    add("run_end")
    return events


def test_measures_follow_the_loop():
    steps, refused = explain(lines(looping_run()), "r1", TIGHT)
    assert not refused
    calls = [s for s in steps if s.type == "tool_call"]
    # exec calls: recent count 0..5 and no-progress streak 0..5 before each decision
    exec_calls = [s for s in calls if s.tool == "exec"]
    assert [s.measures.recent for s in exec_calls] == [0, 1, 2, 3, 4, 5]
    assert [s.measures.streak for s in exec_calls] == [0, 1, 2, 3, 4, 5]
    assert [s.verdict.decision for s in exec_calls] == ["allow", "allow", "allow", "warn", "allow", "block"]
    assert exec_calls[3].verdict.detector == "generic_repeat" and exec_calls[3].verdict.count == 3
    assert exec_calls[5].verdict.count == exec_calls[5].measures.streak == 5
    # a blocked call is recorded as a veto record (spec §7.1), and explain says so
    assert exec_calls[5].history == exec_calls[4].history + 1
    assert "veto record" in exec_calls[5].note
    unknown = [s for s in calls if s.tool == "web_serch"]
    assert [s.measures.unknown for s in unknown] == [0, 1]
    assert unknown[1].measures.unknown_name == "web_serch"
    results = [s for s in steps if s.type == "tool_result" and s.tool == "web_serch"]
    assert all(s.unknown_tool == "web_serch" and s.result_hash.startswith("error:") for s in results)
    # compaction arms the guard; the third identical read aborts the run
    compaction = next(s for s in steps if s.type == "compaction")
    assert compaction.guard == "armed 3/3" and "armed for 3 attempts" in compaction.note
    reads = [s for s in steps if s.type == "tool_result" and s.tool == "read"]
    assert [s.guard for s in reads] == ["armed 2/3", "armed 1/3", "ABORTED"]
    assert reads[-1].verdict.decision == "abort" and reads[-1].verdict.error == "compaction_loop_persisted"
    duplicate = steps[-2]
    assert duplicate.verdict is None and duplicate.note.startswith("duplicate: seq 1")
    assert steps[-1].type == "run_end" and "freed" in steps[-1].note


def test_ping_pong_count_and_evidence():
    events = []
    for i in range(8):
        tool, path = ("read", "a") if i % 2 == 0 else ("write", "b")
        events.append(
            {
                "type": "tool_call",
                "run_id": "pp",
                "seq": 2 * i,
                "tool_call_id": f"c{i}",
                "tool_name": tool,
                "args": {"p": path},
            }
        )
        if i != 4:  # the fifth call is blocked: a gateway does not run it
            events.append(
                {
                    "type": "tool_result",
                    "run_id": "pp",
                    "seq": 2 * i + 1,
                    "tool_call_id": f"c{i}",
                    "tool_name": tool,
                    "result": {"content": [{"type": "text", "text": path}]},
                }
            )
    steps, _ = explain(lines(events), "pp", TIGHT)
    calls = [s for s in steps if s.type == "tool_call"]
    assert [s.measures.ping_pong for s in calls][:5] == [0, 0, 3, 4, 5]
    assert calls[3].measures.ping_pong_with == "read" and calls[3].measures.ping_pong_no_progress
    assert calls[2].verdict.decision == "warn" and calls[2].verdict.detector == "ping_pong"
    assert calls[4].verdict.decision == "block" and calls[4].verdict.count == 5
    # the blocked call is a veto record in the tail: the alternation goes on, still
    # with no-progress evidence (the veto is no evidence either way: spec §7.4)
    assert calls[5].measures.ping_pong == 6 and calls[5].measures.ping_pong_no_progress
    # ... and the loop, back after its block, ends the run (spec §8.3)
    assert (calls[5].verdict.decision, calls[5].verdict.error) == ("abort", "loop_recovery_exhausted")
    assert calls[4].note.startswith("blocked by the detectors (ping_pong): the loop is latched")
    assert "the loop came back after its block, so recovery ends the run" in calls[5].note
    assert calls[6].note == "run already aborted: answered with its abort"


def test_turns_latches_and_their_release_are_named():
    """A turn's open calls counted as vetoes, the turn rule, a latch, and the
    result that releases it, each on its step (spec §8), with recovery off."""
    from schemas.policy import parse_policy

    def call(seq, tool, path, turn):
        return {
            "type": "tool_call",
            "run_id": "t",
            "seq": seq,
            "tool_call_id": f"c{seq}",
            "tool_name": tool,
            "args": {"p": path},
            "turn": turn,
        }

    def result(seq, call_seq, tool, text):
        return {
            "type": "tool_result",
            "run_id": "t",
            "seq": seq,
            "tool_call_id": f"c{call_seq}",
            "tool_name": tool,
            "result": {"content": [{"type": "text", "text": text}]},
        }

    events = []
    for n in range(4):
        events += [call(2 * n, "read", "a", f"m{n}"), result(2 * n + 1, 2 * n, "read", "same")]
    events += [call(8, "read", "a", "T"), call(9, "read", "a", "T"), call(10, "write", "b", "T")]
    events += [call(11, "read", "a", "U"), call(12, "ls", "c", "V"), result(13, 12, "ls", "files")]
    steps, refused = explain(lines(events), "t", TIGHT, parse_policy({"recovery": {"enabled": False}}))
    assert refused == []
    by_seq = {s.seq: s for s in steps}
    assert (by_seq[9].turn, by_seq[9].pending, by_seq[9].verdict.decision) == ("T", 1, "block")
    assert by_seq[9].note.startswith("blocked by the detectors (generic_repeat)")
    assert by_seq[10].note.startswith("blocked by the turn rule: turn T already had a block (read, generic_repeat)")
    assert by_seq[11].note.startswith("blocked by a latch: generic_repeat on read")
    assert by_seq[12].verdict.decision == "allow" and by_seq[12].latches == [by_seq[9].verdict.warning_key]
    assert by_seq[13].note == "a call that was allowed ran: 1 latch released" and by_seq[13].latches == []
    text = format_timeline(steps, "t", refused)
    assert "turn T, 1 open call of it counted as vetoes" in text
    assert "policy: mode enforce; recovery off; no budget; escalation off" in text


def test_a_late_result_shows_the_call_it_completes():
    """A call that left the history before its result (historySize 2 here) is
    still the call its result completes: explain shows its args hash."""
    small = FleetConfig(default=LoopDetectionConfig(enabled=True, history_size=2))
    events = [
        {"type": "tool_call", "run_id": "r", "seq": 0, "tool_call_id": "slow", "tool_name": "read", "args": {"p": "a"}}
    ]
    for i in range(1, 3):
        events.append(
            {
                "type": "tool_call",
                "run_id": "r",
                "seq": 2 * i - 1,
                "tool_call_id": f"c{i}",
                "tool_name": "ls",
                "args": {"i": i},
            }
        )
        events.append(
            {
                "type": "tool_result",
                "run_id": "r",
                "seq": 2 * i,
                "tool_call_id": f"c{i}",
                "tool_name": "ls",
                "result": {},
            }
        )
    events.append(
        {"type": "tool_result", "run_id": "r", "seq": 5, "tool_call_id": "slow", "tool_name": "read", "result": {}}
    )
    steps, _ = explain(lines(events), "r", small)
    late = steps[-1]
    assert late.args_hash == steps[0].args_hash
    assert late.note == "its call had left the history unfinished: appended with the call's args hash"


@pytest.mark.parametrize(
    "run", ["run-healthy", "run-repeat", "run-poll", "run-pingpong", "run-unknown-tool", "run-compaction"]
)
def test_verdicts_are_the_engines(run):
    """Explain and replay agree on every verdict of the sample trace, and a
    fired detector's count is the measurement explain shows for it."""
    config = load_config(SAMPLE_CONFIG).config
    raw = SAMPLE.read_bytes().splitlines(keepends=True)
    out = io.BytesIO()
    replay(raw, config, out, io.StringIO())
    expected = [v for v in map(decode_verdict, out.getvalue().splitlines()) if v.run_id == run]
    steps, refused = explain(((f"line {i}", line) for i, line in enumerate(raw, 1)), run, config)
    assert not refused
    assert [s.verdict for s in steps if s.verdict is not None] == expected
    field = {
        "unknown_tool_repeat": "unknown",
        "global_circuit_breaker": "streak",
        "known_poll_no_progress": "streak",
        "argument_churn": "churn",
        "ping_pong": "ping_pong",
    }
    for s in steps:
        v = s.verdict
        if v is None or v.detector is None or s.type != "tool_call" or v.decision == "abort":
            continue
        if v.detector == "generic_repeat":
            measured = s.measures.streak if v.level == "critical" else s.measures.recent
        else:
            measured = getattr(s.measures, field[v.detector])
        assert measured == v.count, (s.seq, v.detector)


def test_text_timeline():
    steps, refused = explain(lines(looping_run()), "r1", TIGHT)
    text = format_timeline(steps, "r1", refused)
    assert "rolling detectors on (warn 3, critical 5" in text
    assert "WARN generic_repeat (warning, count 3)" in text
    assert "BLOCK generic_repeat (critical, count 5)" in text
    assert "ABORT compaction_loop_persisted" in text
    assert "summary: 11 calls, 1 warned, 1 blocked, run ABORTED" in text
    assert "np 5=" in text and "unk 1(web_serch)" in text


def test_short_hashes():
    assert short("exec:" + "ab" * 32) == "abababab"
    assert short("error:" + "cd" * 32) == "err:cdcdcdcd"
    assert short(None) == "-"
    assert shorten_key("generic:exec:exec:" + "0" * 64) == "generic:exec:exec:00000000…"


def test_cli_from_file(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in looping_run()) + "not json\n")
    assert cli_main(["explain", "r1", "--events", str(path)]) == 0
    text = capsys.readouterr().out
    assert "rolling detectors off" in text  # defaults: rolling detectors need enabled: true
    assert "ABORT compaction_loop_persisted" in text  # the guard runs anyway
    assert "refused line 26: not a JSON event" in text
    assert cli_main(["explain", "r1", "--events", str(path), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["type"] == "tool_call" and rows[0]["measures"]["recent"] == 0
    assert rows[-3]["verdict"]["decision"] == "abort"
    assert cli_main(["explain", "nope", "--events", str(path)]) == 1
    assert "run nope: no events found" in capsys.readouterr().out
