"""`apply_safely`: which engine failures refuse an event and which stay errors."""

from __future__ import annotations

import pytest

import streams.apply
from schemas.codec import BadEvent, decode_event
from schemas.config import FleetConfig
from schemas.events import ToolCall, ToolResult
from streams.apply import apply_safely

CONFIG = FleetConfig()
CALL = b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"exec","args":{"cmd":"ls"}}'


def test_an_engine_bug_is_not_reported_as_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(state, event, config, policy=None):  # type: ignore[no-untyped-def]
        raise ValueError("engine bug")

    monkeypatch.setattr(streams.apply, "apply", broken)
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
