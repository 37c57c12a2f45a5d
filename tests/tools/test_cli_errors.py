"""What a person's mistakes cost: one line, a non-zero exit, no traceback, no long wait; and no silent run."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from builders import run_cli
from schemas.codec import BadEvent, decode_event

TRUNCATED = b'{"type": "tool_call", "run_id": "r", "seq": 0, "tool_call_id": "c", "tool_na'


def lines(done) -> list[str]:
    text = done.stderr.decode()
    assert "Traceback" not in text
    return text.splitlines()


def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_port_out_of_range_is_refused_when_parsed() -> None:
    for command, option in (("dashboard", "--port"), ("worker", "--web-port"), ("fleet", "--web-port")):
        done = run_cli(option, "99999", command=command)
        assert done.returncode == 2
        assert lines(done)[-1].endswith(f"argument {option}: expected a port from 1 to 65535, got '99999'")


def test_a_web_port_taken_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--web-port", str(port), "--data-dir", str(tmp_path), command="worker")
    assert done.returncode == 1
    (line,) = [line for line in lines(done) if "level=error" in line]
    assert f'msg="cannot listen on 127.0.0.1:{port}: address already in use"' in line


def test_kafka_out_of_reach_is_one_line_after_the_connect_timeout() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    expected = f"loopwarden: cannot reach Kafka at {bootstrap}: connection refused (waited 1s, --connect-timeout)"
    for command, args in (("explain", ["r1"]), ("tail", []), ("produce", ["-"]), ("audit", [])):
        done = run_cli(*args, "--bootstrap", bootstrap, "--connect-timeout", "1s", command=command)
        assert done.returncode == 2, command
        assert lines(done)[-1] == expected, command


def test_a_missing_topic_is_named_with_the_command_that_creates_it(broker) -> None:
    topic = f"no-such-{uuid.uuid4().hex[:8]}"
    done = run_cli("--bootstrap", broker.bootstrap, "--events-topic", topic, "-", command="produce", stdin=b"")
    assert done.returncode == 1
    assert lines(done) == [
        f"loopwarden: topic {topic} does not exist: create it with `loopwarden topics create --bootstrap {broker.bootstrap}`"
    ]


def test_an_empty_trace_still_ends_with_a_summary(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    done = run_cli(str(empty))
    assert done.returncode == 0 and done.stdout == b""
    note, summary = lines(done)
    assert note.startswith("loopwarden: note: the rolling detectors") and "enabled: true" in note
    assert summary.startswith("replay: 0 events, 0 verdicts, 0 dead letters, ")


def test_a_truncated_line_is_refused_in_the_words_a_record_gets(tmp_path: Path) -> None:
    trace = tmp_path / "cut.jsonl"
    trace.write_bytes(TRUNCATED + b"\n")
    done = run_cli(str(trace))
    assert done.returncode == 1
    try:
        decode_event(TRUNCATED)
    except BadEvent as exc:
        reason = str(exc)
    assert f"line 1: {reason}" in lines(done)
    assert lines(done)[-1].startswith("replay: 1 event, 0 verdicts, 1 dead letter, ")


def test_a_bad_policy_mode_lists_the_valid_ones(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json5"
    policy.write_text("{mode: 'enforcing'}")
    done = run_cli("--policy", str(policy), "-")
    assert done.returncode == 2
    assert lines(done) == [
        f"loopwarden: policy error: {policy}: mode: Invalid enum value 'enforcing' (expected one of: enforce, shadow)"
    ]
