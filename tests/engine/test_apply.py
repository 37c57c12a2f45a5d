"""`apply_safely`: which engine failures refuse an event and which stay errors."""

from __future__ import annotations

import pytest

import streams.engine.entry
from schemas.codec import BadEvent, decode_event
from schemas.config import FleetConfig
from schemas.events import ToolCall, ToolResult
from streams.engine.entry import apply_safely
from schemas.configparse import ConfigError

CONFIG = FleetConfig()
CALL = b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"exec","args":{"cmd":"ls"}}'


def test_an_engine_bug_is_not_reported_as_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(state, event, config, policy=None, trace=False):  # type: ignore[no-untyped-def]
        raise ValueError("engine bug")

    monkeypatch.setattr(streams.engine.entry, "apply", broken)
    with pytest.raises(ValueError, match="engine bug") as raised:
        apply_safely(None, decode_event(CALL), CONFIG)
    assert not isinstance(raised.value, BadEvent)


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (ToolCall(run_id="r", seq=1, tool_call_id="c", tool_name="exec", args={"x": object()}), "args"),
        (ToolResult(run_id="r", seq=2, tool_call_id="c", tool_name="exec", result=[object()]), "result"),
    ],
)
def test_a_payload_that_cannot_be_hashed_is_refused_naming_the_field(event: ToolCall | ToolResult, field: str) -> None:
    with pytest.raises(BadEvent, match=f"cannot hash payload '{field}'") as raised:
        apply_safely(None, event, CONFIG)
    assert raised.value.kind == "unhashable"


def test_a_healthy_event_is_applied() -> None:
    outcome = apply_safely(None, decode_event(CALL), CONFIG)
    assert [v.decision for v in outcome.verdicts] == ["allow"]


def _call(seq: int) -> ToolCall:
    return ToolCall(run_id="r", seq=seq, tool_call_id=f"c{seq}", tool_name="exec", args={"cmd": "ls"})


def test_a_seq_jump_is_refused_and_the_run_goes_on() -> None:
    """2**63-1 under a live run's id would make every later event of the run a
    duplicate: it is refused, and the run's next event is judged as usual."""
    state = apply_safely(None, _call(5), CONFIG).state
    with pytest.raises(BadEvent, match=r"seq 9223372036854775807 is \d+ above the run's last seq 5") as raised:
        apply_safely(state, _call(2**63 - 1), CONFIG)
    assert raised.value.kind == "seq_jump"
    outcome = apply_safely(state, _call(6), CONFIG)
    assert not outcome.duplicate and [v.decision for v in outcome.verdicts] == ["allow"]


def test_the_first_seq_of_a_run_is_free_and_the_bound_is_inclusive() -> None:
    """A run's first event (the OpenClaw plugin numbers it from the clock in
    microseconds) has nothing to jump from; up to the bound is accepted."""
    clock = 1_767_225_600_000_000
    state = apply_safely(None, _call(clock), CONFIG, max_jump=10).state
    assert state is not None and state.last_seq == clock
    assert apply_safely(state, _call(clock + 10), CONFIG, max_jump=10).verdicts
    with pytest.raises(BadEvent, match=r"\(limit 10, LOOPWARDEN_MAX_SEQ_JUMP\)"):
        apply_safely(state, _call(clock + 21), CONFIG, max_jump=10)


def test_the_bound_comes_from_one_variable() -> None:
    assert streams.engine.entry.max_seq_jump({}) == streams.engine.entry.DEFAULT_MAX_SEQ_JUMP == 10**12
    assert streams.engine.entry.max_seq_jump({"LOOPWARDEN_MAX_SEQ_JUMP": "1_000"}) == 1000
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ConfigError, match=f"LOOPWARDEN_MAX_SEQ_JUMP: expected a positive integer, got '{bad}'"):
            streams.engine.entry.max_seq_jump({"LOOPWARDEN_MAX_SEQ_JUMP": bad})
