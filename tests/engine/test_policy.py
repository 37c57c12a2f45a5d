"""The policy's rules (policy spec §2, §3): budget, escalation and shadow
mode, in the spec's order, as pure functions of (state, event, config, policy)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.policy import FleetPolicy, parse_policy
from schemas.state import VETO
from tests.builders import NO_RECOVERY, Driver, call, compaction, low, result
from streams.engine import apply

ENOENT = {"content": [{"type": "text", "text": "ENOENT"}]}


def policy(**document: Any) -> FleetPolicy:
    return parse_policy(document)


def same_call(d: Driver, **kw: Any) -> Any:
    return d.step("read", {"path": "a"}, res=ENOENT, **kw)


# --- budget ---------------------------------------------------------------------------------------


def test_budget_aborts_call_max_plus_one_and_answers_later_calls_with_it() -> None:
    d = Driver(low(), policy(budget={"maxToolCalls": 3}))
    assert [d.step("read", {"n": n}, res=ENOENT).decision for n in range(3)] == ["allow"] * 3
    over = d.call("write", {"n": 4})
    assert (over.decision, over.level, over.detector, over.count, over.error) == (
        "abort",
        "critical",
        "tool_call_budget",
        3,
        "tool_call_budget",
    )
    assert "budget of 3 tool calls" in over.message
    assert len(d.state().history) == 3  # the call over the budget is not recorded
    later = d.call("read", {"n": 0})
    assert (later.decision, later.detector, later.error, later.count) == (
        "abort",
        "tool_call_budget",
        "tool_call_budget",
        3,
    )
    assert d.state().tool_calls == 4  # calls answered by the abort are not counted
    d.end()
    assert (d.state().tool_calls, d.state().aborted) == (0, None)
    assert d.call("read", {"n": 9}).decision == "allow"


def test_duplicates_are_not_calls() -> None:
    pol = policy(budget={"maxToolCalls": 1})
    state = apply(None, call("r", 1, "read", {"n": 1}), low(), pol).state
    again = apply(state, call("r", 1, "read", {"n": 1}), low(), pol)
    assert again.duplicate and again.state.tool_calls == 1


def test_budget_is_judged_before_the_detectors() -> None:
    d = Driver(low(), policy(budget={"maxToolCalls": 5}))
    assert [same_call(d).decision for _ in range(5)] == ["allow", "allow", "allow", "warn", "allow"]
    # Without a budget the sixth identical call is blocked by generic_repeat; the budget answers first.
    assert d.call("read", {"path": "a"}).detector == "tool_call_budget"
    plain = Driver(low())
    for _ in range(5):
        same_call(plain)
    assert plain.call("read", {"path": "a"}).decision == "block"


def test_no_budget_at_zero() -> None:
    d = Driver(low(detectors={"genericRepeat": False}), policy(budget={"maxToolCalls": 0}))
    assert {d.step("read", {"n": n % 2 + 10 * n}).decision for n in range(40)} == {"allow"}


# --- escalation -----------------------------------------------------------------------------------


def test_escalation_aborts_when_blocked_calls_reach_blocked_calls() -> None:
    d = Driver(low(), policy(recovery={"enabled": False}, escalation={"enabled": True, "blockedCalls": 2, "window": 4}))
    decisions = [same_call(d).decision for _ in range(6)]
    assert decisions == ["allow", "allow", "allow", "warn", "allow", "block"]
    assert d.state().escalation == [False, False, False, True]  # at most `window` entries
    v = d.call("read", {"path": "a"})
    assert (v.decision, v.level, v.detector, v.count, v.error, v.warning_key, v.paired_tool_name) == (
        "abort",
        "critical",
        "blocks_ignored",
        2,
        "blocks_ignored",
        None,
        None,
    )
    assert "read" in v.message and "kept calling what was blocked" in v.message
    assert d.call("ls").detector == "blocks_ignored"  # the run is over
    d.end()
    assert d.state().escalation == []


def test_escalation_counts_only_on_a_blocked_call() -> None:
    d = Driver(low(), policy(escalation={"enabled": True, "blockedCalls": 2, "window": 10}))
    d.call("ls")
    d.state().escalation[:] = [True, True, True]
    assert d.call("ls", {"other": 1}).decision == "allow"  # allowed: no escalation, however many were blocked


def test_escalation_disabled_keeps_no_memory() -> None:
    d = Driver(low(), policy(recovery={"enabled": False}, escalation={"enabled": False}))
    for _ in range(8):
        same_call(d)
    assert d.state().escalation == [] and d.state().aborted is None


def test_the_ping_pong_that_keeps_being_blocked_is_ended_by_blocks_ignored() -> None:
    """A model alternating two failing reads; when blocked, it calls the other
    side again. Without recovery or escalation it is blocked until its own
    turn limit; recovery ends it at the first call after the block."""

    def story(d: Driver, turns: int) -> list[tuple[str, str | None]]:
        seen, side = [], 0
        for _ in range(turns):
            v = d.step("read", {"path": "ab"[side % 2]}, res=ENOENT)
            seen.append((v.decision, v.detector))
            if v.decision == "abort":
                break
            side += 1
        return seen

    plain = story(Driver(low(), NO_RECOVERY), 40)
    assert len(plain) == 40 and plain[-1][0] == "block"
    recovered = story(Driver(low()), 40)
    assert recovered[-2:] == [("block", "ping_pong"), ("abort", "ping_pong")]
    ended = story(Driver(low(), policy(recovery={"enabled": False}, escalation={"enabled": True})), 40)
    assert ended[-3:] == [("block", "ping_pong"), ("block", "ping_pong"), ("abort", "blocks_ignored")]


# --- shadow mode ----------------------------------------------------------------------------------


def test_shadow_allows_everything_and_records_would_be_blocks_as_calls() -> None:
    d = Driver(low(), policy(mode="shadow", recovery={"enabled": False}))
    verdicts = [same_call(d) for _ in range(8)]
    assert {v.decision for v in verdicts} == {"allow"}
    assert [v.shadow_decision for v in verdicts] == [None, None, None, "warn", None, "block", "block", "block"]
    assert all(v.error is None for v in verdicts)
    assert len(d.state().history) == 8 and not any(r.flags & VETO for r in d.state().history)


def test_shadow_reports_the_budget_once_and_judges_later_calls() -> None:
    d = Driver(low(), policy(mode="shadow", recovery={"enabled": False}, budget={"maxToolCalls": 2}))
    verdicts = [same_call(d) for _ in range(7)]
    assert [(v.decision, v.shadow_decision, v.detector) for v in verdicts] == [
        ("allow", None, None),
        ("allow", None, None),
        ("allow", "abort", "tool_call_budget"),
        ("allow", "warn", "generic_repeat"),
        ("allow", None, "generic_repeat"),
        ("allow", "block", "generic_repeat"),
        ("allow", "block", "generic_repeat"),
    ]
    assert verdicts[2].error is None and len(d.state().history) == 7


def test_shadow_reports_escalation_once_then_clears_the_memory() -> None:
    d = Driver(
        low(), policy(mode="shadow", recovery={"enabled": False}, escalation={"enabled": True, "blockedCalls": 2})
    )
    verdicts = [same_call(d) for _ in range(9)]
    assert [v.shadow_decision for v in verdicts[5:]] == ["block", "abort", "block", "abort"]
    assert verdicts[6].detector == "blocks_ignored" and verdicts[6].count == 2
    assert d.state().escalation == [] and d.state().aborted is None


def test_shadow_guard_reports_once_and_disarms() -> None:
    cfg = low(detectors={"genericRepeat": False})
    d = Driver(cfg, policy(mode="shadow"))
    d.compact()
    reports = []
    for _ in range(6):
        d.call("read", {"path": "a"})
        reports += d.result("read", result=ENOENT)
    assert [(v.decision, v.shadow_decision, v.detector, v.error) for v in reports] == [
        ("allow", "abort", "compaction_loop_persisted", None)
    ]
    assert (d.state().guard_remaining, d.state().guard_window, d.state().aborted) == (0, [], None)
    enforce = Driver(cfg, policy())
    enforce.compact()
    for _ in range(3):
        enforce.call("read", {"path": "a"})
        aborted = enforce.result("read", result=ENOENT)
    assert [v.decision for v in aborted] == ["abort"]


def test_an_agent_in_shadow_beside_one_enforced() -> None:
    d = Driver(low(), policy(agents={"nightly": {"mode": "shadow"}}))
    for _ in range(6):
        shadowed = d.step("read", {"path": "a"}, res=ENOENT, run="n", agent="nightly")
        enforced = d.step("read", {"path": "a"}, res=ENOENT, run="e", agent="day")
    assert (shadowed.decision, shadowed.shadow_decision) == ("allow", "block")
    assert (enforced.decision, enforced.shadow_decision) == ("block", None)


# --- properties -----------------------------------------------------------------------------------

STEPS = st.lists(
    st.tuples(st.sampled_from(["call", "result", "compaction"]), st.integers(0, 2), st.integers(0, 1)),
    max_size=60,
)
POLICIES = st.fixed_dictionaries(
    {
        "escalation": st.fixed_dictionaries(
            {"enabled": st.booleans(), "blockedCalls": st.integers(1, 3), "window": st.integers(3, 5)}
        ),
        "budget": st.fixed_dictionaries({"maxToolCalls": st.integers(0, 30)}),
    }
)


def run(steps: list[tuple[str, int, int]], pol: FleetPolicy | None) -> tuple[list[Any], Any]:
    """Calls of three argument sets, results of two kinds, compactions; a call
    whose verdict blocks or aborts gets no result, as a gateway does."""
    state, verdicts, seq, open_call = None, [], 0, None
    for kind, args, res in steps:
        seq += 1
        if kind == "call":
            out = apply(state, call("r", seq, "read", {"a": args}), low(), pol)
            open_call = seq if out.verdicts[0].decision in ("allow", "warn") else None
        elif kind == "result" and open_call is not None:
            out = apply(state, result("r", seq, "read", f"c{open_call}", result={"r": res}), low(), pol)
            open_call = None
        else:
            out = apply(state, compaction("r", seq), low(), pol)
        state = out.state
        verdicts += out.verdicts
    return verdicts, state


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_a_default_policy_decides_as_no_policy(steps: list[tuple[str, int, int]]) -> None:
    assert run(steps, None)[0] == run(steps, policy())[0]


@settings(max_examples=150, deadline=None)
@given(STEPS, POLICIES)
def test_enforce_mode_never_sets_shadow_decision_and_memory_stays_bounded(
    steps: list[tuple[str, int, int]], document: dict[str, Any]
) -> None:
    pol = policy(**document)
    verdicts, state = run(steps, pol)
    assert all(v.shadow_decision is None for v in verdicts)
    assert len(state.escalation if state else []) <= pol.default.window


@settings(max_examples=150, deadline=None)
@given(STEPS, POLICIES)
def test_shadow_matches_enforce_up_to_the_first_divergence(
    steps: list[tuple[str, int, int]], document: dict[str, Any]
) -> None:
    enforced, _ = run(steps, policy(**document))
    shadowed, state = run(steps, policy(mode="shadow", **document))
    assert {v.decision for v in shadowed} <= {"allow"}
    assert len(state.escalation if state else []) <= policy(**document).default.window
    for e, s in zip(enforced, shadowed, strict=False):
        assert s.shadow_decision == (None if e.decision == "allow" else e.decision)
        assert (s.detector, s.count, s.level) == (e.detector, e.count, e.level)
        if e.decision in ("block", "abort"):
            break  # enforce mode's gateway ran nothing here: from now on the traces part
