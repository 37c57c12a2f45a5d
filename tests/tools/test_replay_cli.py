"""`loopwarden replay [--config F] EVENTS.jsonl|-`, run as a separate process."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from builders import low, run_cli
from schemas.codec import append_verdict, decode_event, encode_verdict
from schemas.policy import parse_policy
from stories import POLICY, section_8_trace
from schemas.configparse import parse_config
from streams.engine import apply
from streams.tools.replay import replay

LOW_CONFIG = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "warningThreshold": 3,
            "criticalThreshold": 5,
            "globalCircuitBreakerThreshold": 7,
        }
    }
}


def ev(kind, run, seq, **fields):
    return json.dumps({"type": kind, "run_id": run, "seq": seq, **fields})


def tc(run, seq, tool="exec", args=None, cid=None):
    return ev(
        "tool_call",
        run,
        seq,
        tool_call_id=cid or f"{run}-{seq}",
        tool_name=tool,
        args=args if args is not None else {"command": "ls"},
    )


def tr(run, seq, cid, text="same", tool="exec"):
    return ev(
        "tool_result", run, seq, tool_call_id=cid, tool_name=tool, result={"content": [{"type": "text", "text": text}]}
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def config_file(tmp_path):
    return write(tmp_path, "config.json", json.dumps(LOW_CONFIG))


def loop_lines(run, n, start=1):
    lines, seq = [], start
    for _ in range(n):
        lines.append(tc(run, seq))
        lines.append(tr(run, seq + 1, f"{run}-{seq}"))
        seq += 2
    return lines


def expected_output(lines, config) -> bytes:
    """What the engine itself answers, line by line, for well-formed input."""
    states, out = {}, []
    for line in lines:
        if not line.strip():
            continue
        try:
            event = decode_event(line.encode())
        except ValueError:
            continue
        outcome = apply(states.get(event.run_id), event, config)
        states[event.run_id] = outcome.state
        out.extend(encode_verdict(v) + b"\n" for v in outcome.verdicts)
    return b"".join(out)


def test_verdicts_in_order_exit_0(tmp_path, config_file):
    r1, r2 = loop_lines("r1", 6), loop_lines("r2", 6)
    lines = [line for pair in zip(r1, r2, strict=True) for line in pair]
    events = write(tmp_path, "events.jsonl", "\n".join(lines) + "\n")
    proc = run_cli("--config", str(config_file), str(events))
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(v["run_id"], v["seq"]) for v in out] == [(r, s) for s in range(1, 12, 2) for r in ("r1", "r2")]
    assert [v["decision"] for v in out if v["run_id"] == "r1"] == ["allow"] * 3 + ["warn", "allow", "block"]
    assert proc.stdout == expected_output(lines, low())


def test_stdin_dash(config_file):
    lines = loop_lines("r1", 6)
    proc = run_cli("--config", str(config_file), "-", stdin=("\n".join(lines) + "\n").encode())
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["decision"] for x in proc.stdout.splitlines()] == ["allow"] * 3 + ["warn", "allow", "block"]


def test_no_config_means_defaults(tmp_path):
    events = write(tmp_path, "e.jsonl", "\n".join(loop_lines("r1", 25)) + "\n")
    proc = run_cli(str(events))
    assert proc.returncode == 0, proc.stderr
    assert {json.loads(x)["decision"] for x in proc.stdout.splitlines()} == {"allow"}
    assert len(proc.stdout.splitlines()) == 25


def test_malformed_lines_reported_with_line_numbers_and_skipped(tmp_path, config_file):
    good = loop_lines("r1", 6)
    lines = [
        good[0],
        good[1],
        "this is not json",  # line 3
        "",  # line 4 (blank)
        ev("tool_cal", "r1", 50, tool_call_id="x", tool_name="t"),  # line 5
        good[2],
        good[3],
        json.dumps({"type": "tool_call", "seq": 60, "tool_call_id": "x", "tool_name": "t"}),  # line 8
        *good[4:],
    ]
    events = write(tmp_path, "e.jsonl", "\n".join(lines) + "\n")
    proc = run_cli("--config", str(config_file), str(events))
    assert proc.returncode == 1
    err = proc.stderr.decode().splitlines()
    *refused, summary = err
    assert [line.split(":")[0] for line in refused] == ["line 3", "line 5", "line 8"]
    assert summary.startswith("replay: 15 events, ") and ", 3 dead letters, " in summary
    # processing continued: every good call still has its verdict, in order
    assert proc.stdout == expected_output(good, low())


def test_whitespace_lines_skipped_other_bytes_refused():
    """Blank means ASCII whitespace only (what bytes.strip removes); a line of
    other bytes is an event that fails to decode."""
    good = [line.encode() for line in loop_lines("r1", 1)]
    lines = [good[0], b"", b" \t\r", b"\x0b\x0c ", b"\xa0", good[1], b"\x1c"]
    out, err = io.BytesIO(), io.StringIO()
    assert replay(lines, low(), out, err) == 2
    assert [line.split(":")[0] for line in err.getvalue().splitlines()] == ["line 5", "line 7"]
    assert out.getvalue() == expected_output(loop_lines("r1", 1), low())


def test_verdicts_are_written_whole_across_output_blocks():
    """The output buffer is flushed in blocks; no verdict is cut or lost."""
    lines = [line.encode() for line in loop_lines("r1", 1200)]
    out = io.BytesIO()
    replay(lines, low(), out, io.StringIO())
    assert out.getvalue() == expected_output(loop_lines("r1", 1200), low())
    assert len(out.getvalue()) > 1 << 16


def test_append_verdict_is_encode_verdict_and_a_newline():
    verdicts = [v for line in loop_lines("r1", 25) for v in apply(None, decode_event(line), low()).verdicts]
    buffer = bytearray(b"x")
    for verdict in verdicts:
        append_verdict(buffer, verdict)
    assert bytes(buffer) == b"x" + b"".join(encode_verdict(v) + b"\n" for v in verdicts)


def test_duplicates_write_nothing(tmp_path, config_file):
    lines = loop_lines("r1", 3)
    with_dups = lines[:2] + [lines[0], lines[1]] + lines[2:] + [lines[0]]
    events = write(tmp_path, "e.jsonl", "\n".join(with_dups) + "\n")
    proc = run_cli("--config", str(config_file), str(events))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["seq"] for x in proc.stdout.splitlines()] == [1, 3, 5]


def test_abort_from_tool_result_is_written_in_order(tmp_path):
    lines = [ev("compaction", "r1", 1)] + loop_lines("r1", 3, start=2) + [tc("r1", 8, "read", {"p": 1})]
    events = write(tmp_path, "e.jsonl", "\n".join(lines) + "\n")
    proc = run_cli(str(events))
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [(v["seq"], v["decision"]) for v in out] == [
        (2, "allow"),
        (4, "allow"),
        (6, "allow"),
        (7, "abort"),
        (8, "abort"),
    ]
    assert out[3]["error"] == "compaction_loop_persisted"


def test_bad_config_exit_2_before_reading_events(tmp_path):
    bad = write(tmp_path, "bad.json", json.dumps({"tools": {"loopDetection": {"warningThreshold": "ten"}}}))
    proc = run_cli("--config", str(bad), "-", stdin=b"not json\n" + tc("r1", 1).encode() + b"\n")
    assert proc.returncode == 2
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert 'tools.loopDetection.warningThreshold: expected a positive integer, got "ten"' in err
    assert "line 1" not in err


def test_bad_agent_config_names_list_index(tmp_path):
    doc = {"agents": {"list": [{"id": "a"}, {"id": "b", "tools": {"loopDetection": {"detectorz": {}}}}]}}
    bad = write(tmp_path, "bad.json", json.dumps(doc))
    proc = run_cli("--config", str(bad), str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2
    assert "agents.list[1].tools.loopDetection.detectorz" in proc.stderr.decode()
    assert proc.stdout == b""


def test_non_finite_config_number_is_a_config_error(tmp_path):
    # Python's JSON reader and JSON5 both accept Infinity
    bad = write(tmp_path, "bad.json", '{"tools": {"loopDetection": {"warningThreshold": Infinity}}}')
    proc = run_cli("--config", str(bad), "-", stdin=tc("r1", 1).encode() + b"\n")
    assert proc.returncode == 2
    assert "tools.loopDetection.warningThreshold" in proc.stderr.decode()
    assert proc.stdout == b""


def test_missing_config_file_exit_2(tmp_path):
    proc = run_cli("--config", str(tmp_path / "nope.json"), "-", stdin=tc("r1", 1).encode())
    assert proc.returncode == 2
    assert proc.stdout == b""


def test_config_correction_is_logged_naming_the_field(tmp_path):
    cfg = write(tmp_path, "c.json5", "{tools: {loopDetection: {warningThreshold: 10, criticalThreshold: 4}}}")
    proc = run_cli("--config", str(cfg), "-", stdin=tc("r1", 1).encode() + b"\n")
    assert proc.returncode == 0, proc.stderr
    assert "tools.loopDetection.criticalThreshold" in proc.stderr.decode()
    assert len(proc.stdout.splitlines()) == 1


def test_the_stories_of_section_8_replay_as_the_engine_played_them(tmp_path):
    """The table's rows, a long ping-pong and a released latch (tests/stories.py):
    `replay` writes exactly the verdicts the engine gave while the stories were
    played, and the runs end where the table says."""
    config_document = {"tools": {"loopDetection": {"enabled": True}}}
    config, policy = parse_config(config_document).config, parse_policy(POLICY)
    lines, plays = section_8_trace(config, policy)
    events = write(tmp_path, "events.jsonl", b"\n".join(lines).decode() + "\n")
    config_path = write(tmp_path, "config.json", json.dumps(config_document))
    policy_path = write(tmp_path, "policy.json", json.dumps(POLICY))
    proc = run_cli("--config", str(config_path), "--policy", str(policy_path), str(events))
    assert proc.returncode == 0, proc.stderr
    written: dict[str, list[bytes]] = {}
    for line in proc.stdout.splitlines():
        written.setdefault(json.loads(line)["run_id"], []).append(line)
    assert written == {run: [encode_verdict(v) for v in story.verdicts] for run, story in plays.items()}
    ended = {run: story.verdicts[-1].error for run, story in plays.items()}
    assert ended == {
        **dict.fromkeys((f"row-{n}" for n in range(1, 7)), "loop_recovery_exhausted"),
        "long-ping-pong": None,
        "released": None,
    }
    assert plays["long-ping-pong"].decisions[19:] == ["block"] * 41
