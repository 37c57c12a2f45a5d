"""Properties over generated multi-run event streams that really loop: replay is
deterministic, redelivered events change no verdict, and a run's state survives
a round trip through its stored bytes at any point."""

from __future__ import annotations

import io
import json
from collections import Counter

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from schemas.config import FleetConfig
from schemas.state import RunState
from schemas.codec import decode_event, encode_verdict
from streams.engine import apply
from schemas.configparse import parse_config
from streams.engine.engine import _seen
from streams.tools.replay import replay

from builders import restored, stored

CONFIG: FleetConfig = parse_config(
    {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": 10,
                "warningThreshold": 3,
                "criticalThreshold": 5,
                "globalCircuitBreakerThreshold": 7,
                "unknownToolThreshold": 3,
                "postCompactionGuard": {"windowSize": 2},
            }
        },
        "agents": {
            "list": [
                {"id": "strict", "tools": {"loopDetection": {"warningThreshold": 2, "criticalThreshold": 3}}},
                {"id": "off", "tools": {"loopDetection": {"enabled": False}}},
            ]
        },
    }
).config

RUNS = ["r1", "r2", "r3"]
CALLS = [
    ("exec", {"command": "make"}),
    ("exec", {"command": "make test"}),
    ("read", {"path": "/a"}),
    ("process", {"action": "poll", "sessionId": "s1"}),
    ("ghost", {"q": 1}),
    ("message", {"action": "send", "to": "u1", "text": "hi"}),
]
OUTCOMES = [
    {"result": {"content": [{"type": "text", "text": "same"}], "details": {"status": "running", "tail": "t"}}},
    {"result": {"content": [{"type": "text", "text": "same"}], "details": {"status": "running", "tail": "t"}}},
    {"result": {"content": [{"type": "text", "text": "other"}], "details": {"messageId": "m9", "ok": True}}},
    {"error": "Unknown tool: Ghost"},
    {"error": "boom"},
    {"result": {"details": {"status": "blocked", "deniedReason": "tool-loop"}}},
    {"result_hash": "precomputed-R"},
    None,  # the call never finishes
]

call_step = st.tuples(
    st.just("call"),
    st.sampled_from(RUNS),
    st.integers(0, len(CALLS) - 1),
    st.integers(0, len(OUTCOMES) - 1),
    st.sampled_from([None, None, None, "strict", "off"]),
)
loop_step = st.tuples(
    st.just("loop"),
    st.sampled_from(RUNS),
    st.integers(0, len(CALLS) - 1),
    st.integers(0, len(OUTCOMES) - 1),
    st.integers(2, 7),
)
orphan_step = st.tuples(st.just("orphan"), st.sampled_from(RUNS), st.integers(0, len(CALLS) - 1), st.integers(0, 4))
step = st.one_of(
    call_step,
    loop_step,
    call_step,
    loop_step,
    orphan_step,
    st.tuples(st.just("compaction"), st.sampled_from(RUNS)),
    st.tuples(st.just("run_end"), st.sampled_from(RUNS)),
)


@st.composite
def event_streams(draw, max_steps=25) -> list[bytes]:
    """JSON lines of a small interleaved multi-run stream with frequent repeats."""
    actions = draw(st.lists(step, min_size=4, max_size=max_steps))
    seqs: dict[str, int] = {}
    lines: list[bytes] = []

    def nxt(run: str) -> int:
        seqs[run] = seqs.get(run, 0) + draw(st.integers(1, 2))
        return seqs[run]

    expanded = []
    for action in actions:
        if action[0] == "loop":
            expanded.extend([("call", action[1], action[2], action[3], None)] * action[4])
        else:
            expanded.append(action)
    for n, action in enumerate(expanded):
        kind, run = action[0], action[1]
        if kind == "call":
            tool, args = CALLS[action[2]]
            body = {
                "type": "tool_call",
                "run_id": run,
                "seq": nxt(run),
                "tool_call_id": f"c{n}",
                "tool_name": tool,
                "args": args,
            }
            if action[4]:
                body["agent_id"] = action[4]
            lines.append(json.dumps(body).encode())
            outcome = OUTCOMES[action[3]]
            if outcome is not None:
                lines.append(
                    json.dumps(
                        {
                            "type": "tool_result",
                            "run_id": run,
                            "seq": nxt(run),
                            "tool_call_id": f"c{n}",
                            "tool_name": tool,
                            **outcome,
                        }
                    ).encode()
                )
        elif kind == "orphan":
            tool, args = CALLS[action[2]]
            lines.append(
                json.dumps(
                    {
                        "type": "tool_result",
                        "run_id": run,
                        "seq": nxt(run),
                        "tool_call_id": f"o{n}",
                        "tool_name": tool,
                        "args": args,
                        **(OUTCOMES[action[3]] or {}),
                    }
                ).encode()
            )
        else:
            lines.append(json.dumps({"type": kind, "run_id": run, "seq": nxt(run)}).encode())
    return lines


def verdicts_of(lines: list[bytes], roundtrip_at: set[int] | frozenset[int] = frozenset()) -> list[bytes]:
    states: dict[str, RunState] = {}
    out: list[bytes] = []
    for i, line in enumerate(lines):
        if i in roundtrip_at:
            states = {run: restored(stored(state)) for run, state in states.items()}
        event = decode_event(line)
        outcome = apply(states.get(event.run_id), event, CONFIG)
        states[event.run_id] = outcome.state
        out.extend(encode_verdict(v) for v in outcome.verdicts)
    return out


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(event_streams())
def test_replaying_twice_gives_identical_verdicts(lines):
    first = verdicts_of(lines)
    second = verdicts_of(lines)
    assert first == second
    # every tool_call got exactly one verdict, in order; anything else is a guard abort on a result
    events = [json.loads(line) for line in lines]
    calls = {(e["run_id"], e["seq"]) for e in events if e["type"] == "tool_call"}
    got = [json.loads(v) for v in first]
    assert [(v["run_id"], v["seq"]) for v in got if (v["run_id"], v["seq"]) in calls] == [
        (e["run_id"], e["seq"]) for e in events if e["type"] == "tool_call"
    ]
    assert all(v["decision"] == "abort" for v in got if (v["run_id"], v["seq"]) not in calls)


@FAST
@given(event_streams())
def test_replay_command_core_matches_engine(lines):
    out, err = io.BytesIO(), io.StringIO()
    refused = replay(iter(line + b"\n" for line in lines), CONFIG, out, err)
    assert refused == 0 and err.getvalue() == ""
    assert out.getvalue() == b"".join(v + b"\n" for v in verdicts_of(lines))


@FAST
@given(st.data())
def test_redelivered_events_change_no_verdict(data):
    lines = data.draw(event_streams())
    resent = data.draw(st.lists(st.tuples(st.integers(0, len(lines) - 1), st.integers(0, len(lines) - 1)), max_size=12))
    # insert copies of already-processed events after their original
    mixed: list[bytes] = []
    inserts: dict[int, list[bytes]] = {}
    for a, b in resent:
        source, after = min(a, b), max(a, b)
        inserts.setdefault(after, []).append(lines[source])
    for i, line in enumerate(lines):
        mixed.append(line)
        mixed.extend(inserts.get(i, []))
    assert verdicts_of(mixed) == verdicts_of(lines)


@FAST
@given(st.data())
def test_state_round_trip_at_any_point_changes_no_verdict(data):
    lines = data.draw(event_streams())
    points = data.draw(st.sets(st.integers(0, len(lines) - 1)))
    assert verdicts_of(lines, points) == verdicts_of(lines)
    assert verdicts_of(lines, set(range(len(lines)))) == verdicts_of(lines)


@FAST
@given(st.data())
def test_history_index_always_matches_the_history(data):
    """The engine's unstored index of args hashes (what lets `detect` skip a call
    not in the window) stays exact through appends, trims and state round trips."""
    lines = data.draw(event_streams(max_steps=40))
    points = data.draw(st.sets(st.integers(0, len(lines) - 1)))
    states: dict[str, RunState] = {}
    for i, line in enumerate(lines):
        if i in points:
            states = {run: restored(stored(state)) for run, state in states.items()}
        event = decode_event(line)
        state = states[event.run_id] = apply(states.get(event.run_id), event, CONFIG).state
        assert _seen(state) == dict(Counter(r.args_hash for r in state.history))
        assert stored(state) == stored(restored(stored(state)))  # the index is never stored


def test_state_round_trip_is_exact_mid_loop():
    lines = [
        json.dumps({"type": "compaction", "run_id": "r1", "seq": 1}).encode(),
        *[
            json.dumps(
                {
                    "type": t,
                    "run_id": "r1",
                    "seq": s,
                    "tool_call_id": f"c{s // 2}",
                    "tool_name": "exec",
                    "args": {"command": "make"},
                    **({"result": {"content": [{"type": "text", "text": "x"}]}} if t == "tool_result" else {}),
                }
            ).encode()
            for s, t in zip(range(2, 12), ["tool_call", "tool_result"] * 5, strict=True)
        ],
    ]
    state = None
    for line in lines[:6]:
        state = apply(state, decode_event(line), CONFIG).state
    again = restored(stored(state))
    assert again == state
    assert stored(again) == stored(state)


def test_generated_streams_really_loop():
    """The generator must reach warnings, blocks and aborts, or the properties test little."""

    def decisions(lines):
        return {json.loads(v)["decision"] for v in verdicts_of(lines)}

    quick = settings(
        max_examples=2000,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    for wanted in ("warn", "block", "abort"):
        found = find(event_streams(), lambda lines, w=wanted: w in decisions(lines), settings=quick)
        assert wanted in decisions(found)
