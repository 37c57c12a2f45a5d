"""The policy file: strict validation naming the path, per-agent merging, and
state and verdicts that stay compatible with what was stored before it."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schemas.codec import encode_verdict
from schemas.policy import Policy, PolicyError, parse_policy
from schemas.policyfile import load_policy
from schemas.state import Abort, RunState
from schemas.verdicts import COMPACTION_LOOP_PERSISTED, Verdict


def test_defaults_are_the_specs() -> None:
    assert parse_policy({}).default == Policy(
        mode="enforce", escalation=False, blocked_calls=3, window=10, max_tool_calls=0
    )


def test_an_agent_block_merges_key_by_key_over_the_top_level() -> None:
    fleet = parse_policy(
        {
            "mode": "shadow",
            "escalation": {"blockedCalls": 2, "window": 4},
            "budget": {"maxToolCalls": 50},
            "agents": {"cheap": {"escalation": {"enabled": True}, "budget": {"maxToolCalls": 200}}},
        }
    )
    assert fleet.for_agent("cheap") == Policy(
        mode="shadow", escalation=True, blocked_calls=2, window=4, max_tool_calls=200
    )
    assert fleet.for_agent("other") == fleet.default == fleet.for_agent(None)
    assert fleet.default.escalation is False


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"agents": {"cheap-model": {"escalation": {"window": 2}}}},
            "agents.cheap-model.escalation.window: must be at least blockedCalls (3), got 2",
        ),
        ({"escalation": {"blockedCalls": 11}}, "escalation.window: must be at least blockedCalls (11), got 10"),
        ({"mode": "audit"}, "mode: Invalid enum value 'audit' (expected one of: enforce, shadow)"),
        ({"agents": {"a.b": {"mode": 1}}}, "agents.a.b.mode: Expected `str`, got `int`"),
        (
            {"agents": {"a.b": {"mode": "enforcing"}}},
            "agents.a.b.mode: Invalid enum value 'enforcing' (expected one of: enforce, shadow)",
        ),
        ({"budget": {"maxToolCalls": -1}}, "budget.maxToolCalls: Expected `int` >= 0"),
        ({"budget": {"maxToolCalls": 1.5}}, "budget.maxToolCalls: Expected `int`, got `float`"),
        ({"escalation": {"window": 0}}, "escalation.window: Expected `int` >= 1"),
        ({"escalation": {"enabled": "yes"}}, "escalation.enabled: Expected `bool`, got `str`"),
        ({"agents": {"a b": {"budgt": {}}}}, "agents.a b: Object contains unknown field `budgt`"),
        ({"loopDetection": {}}, "(top level): Object contains unknown field `loopDetection`"),
        ([], "(top level): Expected `object`, got `array`"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_path(document: object, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(document)
    assert str(caught.value) == message


def test_json5_file_and_env_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.json5"
    path.write_text("{mode: 'shadow', // rolling out\n budget: {maxToolCalls: 5,},}", encoding="utf-8")
    assert load_policy(path).default == Policy(mode="shadow", max_tool_calls=5)  # type: ignore[union-attr]
    monkeypatch.setenv("LOOPWARDEN_POLICY", str(path))
    assert load_policy(None) == load_policy(path)
    monkeypatch.delenv("LOOPWARDEN_POLICY")
    assert load_policy(None) is None


def test_a_bad_file_names_itself_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"escalation": {"window": "10"}}', encoding="utf-8")
    with pytest.raises(PolicyError, match=rf"^{path}: escalation.window: Expected `int`, got `str`$"):
        load_policy(path)
    path.write_text("{mode:", encoding="utf-8")
    with pytest.raises(PolicyError, match=rf"^{path}: not valid JSON or JSON5"):
        load_policy(path)
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "missing.json")


def test_a_verdict_without_policy_ends_with_null_shadow_decision_agent_and_ts() -> None:
    verdict = Verdict(run_id="r", seq=1, tool_call_id="c", tool_name="t", decision="allow")
    assert encode_verdict(verdict).endswith(b'"error":null,"shadow_decision":null,"agent_id":null,"ts":null}')


def test_states_stored_before_the_policy_decode_with_its_defaults() -> None:
    class OldAbort(msgspec.Struct, array_like=True):
        tool: str
        count: int
        message: str

    class OldState(msgspec.Struct, kw_only=True):
        last_seq: int
        aborted: OldAbort

    old = msgspec.msgpack.encode(OldState(last_seq=4, aborted=OldAbort("exec", 3, "m")))
    state = msgspec.msgpack.decode(old, type=RunState)
    assert state.aborted == Abort("exec", 3, "m", COMPACTION_LOOP_PERSISTED)
    assert (state.tool_calls, state.escalation) == (0, [])
