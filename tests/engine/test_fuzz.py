"""Fuzzing the event decoder and the engine with hypothesis.

* arbitrary bytes, arbitrary JSON and event-shaped JSON with hostile field
  values: `decode_event` returns an event or raises `BadEvent`, nothing else;
* arbitrary *valid* events (any payloads, seqs in any order, any types):
  `apply` never raises, is deterministic, and the state stays bounded
  (history by historySize, warning keys by their cap, guard window by its
  size, last_seq never goes back), and survives its stored round trip.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.state import MAX_UNFINISHED, RunState
from schemas.codec import BadEvent, decode_event
from streams.engine import apply
from schemas.configparse import parse_config
from streams.engine.warnings import MAX_KEYS
from streams.engine.entry import apply_safely

from builders import restored, stored

HISTORY = 6
WINDOW = 2
CONFIG = parse_config(
    {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": HISTORY,
                "warningThreshold": 2,
                "criticalThreshold": 3,
                "globalCircuitBreakerThreshold": 4,
                "unknownToolThreshold": 2,
                "postCompactionGuard": {"windowSize": WINDOW},
            }
        },
        "agents": {"list": [{"id": "off", "tools": {"loopDetection": {"enabled": False}}}]},
    }
).config

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
TOOLS = ["exec", "process", "read", "update_plan", "message", "sessions_send", "command_status", "web_serch"]
FIELDS = [
    "type",
    "run_id",
    "seq",
    "tool_call_id",
    "tool_name",
    "args",
    "args_hash",
    "result",
    "error",
    "result_hash",
    "unknown_tool_name",
    "agent_id",
    "session_key",
    "ts",
    "details",
]
hostile_values = (
    json_values
    | st.sampled_from(["tool_call", "tool_result", "compaction", "run_end", "", "\x00", "\ud800"])
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
)


def _check_decode(data: bytes) -> None:
    try:
        event = decode_event(data)
    except BadEvent:
        return
    # Whatever decodes must also be refused only with BadEvent by the engine path.
    try:
        apply_safely(None, event, CONFIG)
    except BadEvent:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_bad_event(data: bytes) -> None:
    _check_decode(data)


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_bad_event(text: str) -> None:
    try:
        decode_event(text)  # str input (lone surrogates included)
    except BadEvent:
        pass


@FUZZ
@given(json_values)
def test_arbitrary_json_raises_only_bad_event(value: Any) -> None:
    _check_decode(json.dumps(value).encode())


@FUZZ
@given(
    st.dictionaries(st.sampled_from(FIELDS), hostile_values, max_size=10),
    st.sampled_from(["tool_call", "tool_result", "compaction", "run_end", None]),
)
def test_event_shaped_json_raises_only_bad_event(fields: dict[str, Any], kind: str | None) -> None:
    if kind is not None:
        fields = {**fields, "type": kind}
    try:
        data = json.dumps(fields, allow_nan=True).encode("utf-8", "surrogatepass")
    except (ValueError, TypeError):
        return
    _check_decode(data)
    _check_decode(data[: len(data) // 2])  # truncated
    _check_decode(data.replace(b":", b":[", 1))  # broken nesting


@FUZZ
@given(st.integers(min_value=0, max_value=2000), st.sampled_from([b"[", b'{"a":', b'[{"b":']))
def test_deep_nesting_raises_only_bad_event(depth: int, opener: bytes) -> None:
    closer = b"]" if opener == b"[" else (b"}" if opener == b'{"a":' else b"}]")
    data = (
        b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","args":'
        + opener * depth
        + b"1"
        + closer * depth
        + b"}"
    )
    _check_decode(data)


# -- valid events: apply never raises, state bounded ---------------------------

payloads = st.one_of(
    json_values,
    st.fixed_dictionaries({"command": st.sampled_from(["make", "ls"])}),
    st.fixed_dictionaries(
        {"action": st.sampled_from(["poll", "log", "send"]), "sessionId": st.sampled_from(["a", "b"])}
    ),
    st.fixed_dictionaries(
        {
            "plan": st.lists(
                st.fixed_dictionaries(
                    {"step": st.text(max_size=5), "status": st.sampled_from(["pending", "completed"])}
                ),
                max_size=3,
            )
        }
    ),
)
results = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2
            ),
            "details": json_values,
        }
    ),
    st.fixed_dictionaries(
        {"details": st.fixed_dictionaries({"status": st.just("blocked"), "deniedReason": st.just("tool-loop")})}
    ),
)
errors = st.one_of(st.sampled_from(["Unknown tool: web_serch", "tool 'x' not found", "boom"]), json_values)


@st.composite
def valid_event(draw: st.DrawFn, run_id: str = "r") -> dict[str, Any]:
    kind = draw(st.sampled_from(["tool_call", "tool_call", "tool_result", "tool_result", "compaction", "run_end"]))
    event: dict[str, Any] = {"type": kind, "run_id": run_id, "seq": draw(st.integers(0, 60))}
    if kind in ("tool_call", "tool_result"):
        event["tool_call_id"] = draw(st.sampled_from(["c1", "c2", "c3"]))
        event["tool_name"] = draw(st.sampled_from(TOOLS))
        if draw(st.booleans()):
            event["args"] = draw(payloads)
        if draw(st.integers(0, 5)) == 0:
            event["args_hash"] = draw(st.text(max_size=10))
    if kind == "tool_call" and draw(st.booleans()):
        event["agent_id"] = draw(st.sampled_from(["off", "other"]))
    if kind == "tool_result":
        choice = draw(st.integers(0, 3))
        if choice == 0:
            event["result"] = draw(results)
        elif choice == 1:
            event["error"] = draw(errors)
        elif choice == 2:
            event["result_hash"] = draw(st.sampled_from(["h1", "h2"]))
            if draw(st.booleans()):
                event["unknown_tool_name"] = "web_serch"
    return event


def _bounded(state: RunState, before: int) -> None:
    assert len(state.history) <= HISTORY
    assert len(state.warning_buckets) <= MAX_KEYS
    assert len(state.unfinished) <= MAX_UNFINISHED
    assert all(record.result_hash is None for record in state.unfinished.values())
    assert len(state.guard_window) <= WINDOW
    assert 0 <= state.guard_remaining <= WINDOW
    assert state.last_seq >= before


@FUZZ
@given(st.lists(valid_event(), max_size=80))
def test_valid_events_never_make_apply_raise(events: list[dict[str, Any]]) -> None:
    encoder = msgspec.json.Encoder()
    state: RunState | None = None
    twin: RunState | None = None
    for raw in events:
        event = decode_event(encoder.encode(raw))
        before = -1 if state is None else state.last_seq
        outcome = apply(state, event, CONFIG)
        state = outcome.state
        _bounded(state, before)
        if not outcome.duplicate and raw["type"] == "tool_call":
            assert len(outcome.verdicts) == 1
        # The same event again is a duplicate: no verdict, no change.
        again = apply(restored(stored(state)), event, CONFIG)
        assert again.duplicate and not again.verdicts
        # Through the stored bytes at every step: the same verdicts.
        replayed = apply(None if twin is None else restored(stored(twin)), event, CONFIG)
        assert [encoder.encode(v) for v in replayed.verdicts] == [encoder.encode(v) for v in outcome.verdicts]
        twin = replayed.state


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from(["exec", "read"]), st.integers(0, 3), st.integers(0, 1)), min_size=1, max_size=300
    )
)
def test_long_loops_keep_state_bounded(calls: list[tuple[str, int, int]]) -> None:
    state: RunState | None = None
    seq = 0
    for i, (tool, arg, result) in enumerate(calls):
        seq += 1
        call = decode_event(
            json.dumps(
                {
                    "type": "tool_call",
                    "run_id": "r",
                    "seq": seq,
                    "tool_call_id": f"c{i}",
                    "tool_name": tool,
                    "args": {"a": arg},
                }
            )
        )
        state = apply(state, call, CONFIG).state
        seq += 1
        done = decode_event(
            json.dumps(
                {
                    "type": "tool_result",
                    "run_id": "r",
                    "seq": seq,
                    "tool_call_id": f"c{i}",
                    "tool_name": tool,
                    "result": {"content": [{"type": "text", "text": str(result)}]},
                }
            )
        )
        state = apply(state, done, CONFIG).state
        if i % 37 == 36:
            seq += 1
            state = apply(
                state, decode_event(json.dumps({"type": "compaction", "run_id": "r", "seq": seq})), CONFIG
            ).state
        _bounded(state, seq - 1)
