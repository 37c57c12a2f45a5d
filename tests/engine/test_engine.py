"""The engine as a whole: verdict shape, run scoping, result matching, duplicates,
history bounds, per-agent config, and the wire decoder (spec §4, §6)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import (
    NO_RECOVERY,
    Driver,
    call,
    compaction,
    expected_args_hash,
    fleet,
    low,
    restored,
    result,
    run_end,
    sha,
    stored,
)
from schemas.config import FleetConfig
from schemas.state import KIND_PROCESS_POLL, KIND_VOLATILE_SEND, MAX_UNFINISHED, VETO
from schemas.codec import MAX_DEPTH, BadEvent, _too_deep, decode_event, encode_verdict
from streams.engine import apply
from streams.engine.engine import call_signature

SAME = {"content": [{"type": "text", "text": "same"}]}


def txt(value):
    return {"content": [{"type": "text", "text": str(value)}]}


# --- verdict shape -------------------------------------------------------------------------------


def test_plain_allow_verdict():
    outcome = apply(None, call("r1", 1, "read", {"p": 1}, call_id="c1"), low())
    (v,) = outcome.verdicts
    assert json.loads(encode_verdict(v)) == {
        "run_id": "r1",
        "seq": 1,
        "tool_call_id": "c1",
        "tool_name": "read",
        "decision": "allow",
        "level": "none",
        "detector": None,
        "count": 0,
        "message": None,
        "warning_key": None,
        "paired_tool_name": None,
        "error": None,
        "shadow_decision": None,
        "agent_id": None,
        "ts": None,
    }


def test_verdicts_carry_the_runs_agent_and_the_deciding_events_ts():
    """The agent named once by a run's first call stays on every later verdict,
    including a result's abort; ts is the deciding event's own, as sent."""
    first = msgspec.structs.replace(call("r1", 1, "read", {"p": 1}, agent="cron"), ts=1796185680.5)
    outcome = apply(None, first, low())
    assert (outcome.verdicts[0].agent_id, outcome.verdicts[0].ts) == ("cron", 1796185680.5)
    state = outcome.state
    later = msgspec.structs.replace(call("r1", 2, "read", {"p": 1}), ts="2026-12-02T05:30:00Z")
    (v,) = apply(state, later, low()).verdicts
    assert (v.agent_id, v.ts) == ("cron", "2026-12-02T05:30:00Z")
    state = apply(state, compaction("r1", 3), low()).state
    seq = 4
    aborted = None
    while aborted is None:
        state = apply(state, call("r1", seq, "exec", {"c": 1}, call_id=f"x{seq}"), low()).state
        timed = msgspec.structs.replace(result("r1", seq + 1, "exec", f"x{seq}", result=SAME), ts=float(seq + 1))
        out = apply(state, timed, low())
        state, aborted = out.state, next((v for v in out.verdicts if v.decision == "abort"), None)
        seq += 2
    assert (aborted.agent_id, aborted.ts) == ("cron", float(seq - 1))


def test_block_verdict_wire_shape():
    d = Driver(low())
    verdicts = [d.step("exec", {"command": "ls"}, res=SAME) for _ in range(6)]
    block = json.loads(encode_verdict(verdicts[5]))
    key = f"generic:exec:{expected_args_hash('exec', {'command': 'ls'})}:{sha({'details': {}, 'text': 'same'})}"
    assert block["decision"] == "block" and block["level"] == "critical"
    assert block["detector"] == "generic_repeat" and block["count"] == 5
    assert block["warning_key"] == key
    assert block["error"] is None and block["paired_tool_name"] is None
    assert "exec" in block["message"] and "5" in block["message"]


def test_every_tool_call_gets_exactly_one_verdict_and_results_none():
    d = Driver(low())
    for i in range(20):
        verdicts = d.feed(call("r1", d.next_seq("r1"), "read", {"p": i % 3}, call_id=f"c{i}"))
        assert len(verdicts) == 1
        assert d.feed(result("r1", d.next_seq("r1"), "read", f"c{i}", result=SAME)) == []
    assert d.feed(compaction("r1", d.next_seq("r1"))) == []
    assert d.feed(run_end("r1", d.next_seq("r1"))) == []


# --- rolling detectors switched off ----------------------------------------------------------------------


@pytest.mark.parametrize("config", [FleetConfig(), fleet(), fleet(enabled=False)])
def test_rolling_detectors_off_unless_enabled_true(config):
    d = Driver(config)
    verdicts = [d.step("exec", {"command": "ls"}, res=SAME) for _ in range(40)]
    assert all((v.decision, v.level, v.detector) == ("allow", "none", None) for v in verdicts)


# --- blocked calls and history ------------------------------------------------------------------------


def test_every_call_is_recorded_a_blocked_one_as_a_veto():
    """Spec §7.1: a blocked call leaves a veto record (no result hash), which
    keeps the streak growing while the model keeps trying it."""
    d = Driver(low(), NO_RECOVERY)
    sizes = []
    for _ in range(8):
        v = d.call("exec", {"command": "ls"})
        sizes.append((v.decision, v.count, len(d.state().history), d.state().history[-1].flags))
        if v.decision != "block":
            d.result("exec", result=SAME)
    assert sizes == [
        ("allow", 0, 1, 0),
        ("allow", 0, 2, 0),
        ("allow", 0, 3, 0),
        ("warn", 3, 4, 0),
        ("allow", 4, 5, 0),
        ("block", 5, 6, VETO),
        ("block", 6, 7, VETO),
        ("block", 7, 8, VETO),
    ]
    assert all(r.result_hash is None for r in d.state().history[5:])


def test_block_lifts_only_when_the_result_changes():
    # a different result for the same call resets the no-progress streak
    d = Driver(low(detectors={"pingPong": False}), NO_RECOVERY)
    for _ in range(5):
        d.step("exec", {"command": "ls"}, res=SAME)
    assert d.call("exec", {"command": "ls"}).decision == "block"
    d.step("exec", {"command": "other"}, res=SAME)
    blocked = d.call("exec", {"command": "ls"})
    assert (blocked.decision, blocked.detector) == ("block", "generic_repeat")  # other calls do not break it
    d.feed(result("r1", d.next_seq("r1"), "exec", "fresh", args={"command": "ls"}, result=txt("new")))
    # The latch (§8.2) holds until a call that was allowed runs: a result of a call never decided is not one.
    assert d.call("exec", {"command": "ls"}).detector == "generic_repeat"
    d.step("exec", {"command": "other"}, res=SAME)
    v = d.call("exec", {"command": "ls"})
    assert (v.decision, v.level, v.detector) == ("allow", "warning", "generic_repeat")


def test_one_interleaved_call_turns_generic_block_into_ping_pong_warning():
    # table order: ping_pong warning (row 6) is checked before generic_repeat critical (row 7)
    d = Driver(low())
    for _ in range(5):
        d.step("exec", {"command": "ls"}, res=SAME)
    assert d.call("exec", {"command": "ls"}).decision == "block"
    d.step("exec", {"command": "other"}, res=SAME)
    v = d.call("exec", {"command": "ls"})
    assert (v.decision, v.level, v.detector, v.count) == ("warn", "warning", "ping_pong", 3)


def test_history_size_bounds_the_counts():
    d = Driver(low(historySize=4, warningThreshold=5, criticalThreshold=6, globalCircuitBreakerThreshold=7))
    verdicts = [d.step("read", {"p": 1}, res=txt(i)) for i in range(12)]
    assert all(v.decision == "allow" and v.level == "none" for v in verdicts)
    assert len(d.state().history) == 4


def test_history_size_drops_oldest():
    d = Driver(low(historySize=3))
    for i in range(3):
        d.step("read", {"p": 1}, res=txt(i))
    assert d.call("read", {"p": 1}).level == "warning"
    d.result("read", result=txt("x"))
    for i in range(3):
        d.step("write", {"p": i}, res=txt(i))
    assert d.call("read", {"p": 1}).level == "none"


# --- run scoping ------------------------------------------------------------------------------------------


def test_runs_are_independent():
    d = Driver(low())
    for _ in range(5):
        d.step("exec", {"c": 1}, run="r1", res=SAME)
    assert d.call("exec", {"c": 1}, run="r1").decision == "block"
    v = d.call("exec", {"c": 1}, run="r2")
    assert (v.decision, v.level) == ("allow", "none")


def test_run_end_frees_history_and_keeps_seq():
    d = Driver(low())
    for _ in range(5):
        d.step("exec", {"c": 1}, res=SAME)
    d.compact()
    d.end()
    last = d.seqs["r1"]
    state = d.state()
    assert state.history == [] and state.guard_remaining == 0 and state.last_seq == last
    # a redelivered older event is still a duplicate
    outcome = apply(d.state(), call("r1", 3, "exec", {"c": 1}), low())
    assert outcome.duplicate and outcome.verdicts == []
    outcome = apply(d.state(), call("r1", last, "exec", {"c": 1}), low())
    assert outcome.duplicate and outcome.verdicts == []
    # a later event starts a fresh history
    v = d.call("exec", {"c": 1})
    assert (v.decision, v.level) == ("allow", "none")
    assert len(d.state().history) == 1


def test_run_end_twice_and_duplicate_run_end():
    state = apply(None, run_end("r1", 5), low()).state
    assert state.last_seq == 5
    assert apply(state, run_end("r1", 5), low()).duplicate


def test_agent_id_from_first_event_that_carries_one():
    config = fleet(
        enabled=True,
        agents={"strict": {"warningThreshold": 2, "criticalThreshold": 3}, "lax": {"warningThreshold": 50}},
    )
    d = Driver(config)
    d.step("read", {"p": 1}, res=txt(0))  # no agent id yet: default (warning 10)
    d.step("read", {"p": 1}, res=txt(1), agent="strict")  # this fixes the run's agent
    v = d.step("read", {"p": 1}, res=txt(2), agent="lax")  # ignored
    assert (v.decision, v.detector, v.count) == ("warn", "generic_repeat", 2)
    assert d.state().agent_id == "strict"
    v = d.call("read", {"p": 1}, run="r2", agent="lax")
    assert d.state("r2").agent_id == "lax"


def test_agent_config_applies_to_the_event_that_carries_it():
    config = fleet(agents={"tight": {"postCompactionGuard": {"windowSize": 2}}})
    d = Driver(config)
    assert d.compact(agent="tight").armed == 2
    assert d.state().agent_id == "tight"
    assert d.compact(run="r2").armed == 3


def test_agent_from_compaction_event_selects_guard_config():
    config = fleet(agents={"off": {"enabled": False}})
    d = Driver(config)
    assert d.compact(agent="off").armed == 0
    for _ in range(4):
        d.step("exec", {"c": 1}, res=SAME)
    assert d.compact().armed == 0


# --- tool_result matching --------------------------------------------------------------------------------


def test_result_fills_newest_open_record_with_same_call_id():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    d.feed(call("r1", 2, "read", {"p": 1}, call_id="c1"))
    d.feed(call("r1", 3, "read", {"p": 2}, call_id="c2"))
    d.feed(result("r1", 4, "read", "c1", result=txt("a")))
    history = d.state().history
    assert [r.result_hash for r in history] == [None, sha({"details": {}, "text": "a"}), None]
    d.feed(result("r1", 5, "read", "c1", result=txt("b")))
    assert [r.result_hash for r in history] == [
        sha({"details": {}, "text": "b"}),
        sha({"details": {}, "text": "a"}),
        None,
    ]
    assert len(history) == 3


def test_result_without_args_takes_the_calls_args_hash():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    d.feed(result("r1", 2, "read", "c1", result=txt("a")))
    (record,) = d.state().history
    assert record.args_hash == expected_args_hash("read", {"p": 1})
    assert record.result_hash == sha({"details": {}, "text": "a"})


def test_send_result_without_args_or_call_is_still_a_send():
    """`sessions_send` is a sending tool by its name alone: a result that comes
    with neither args nor an open call still has its volatile ids dropped, and
    its record keeps that kind."""
    d = Driver(low())
    sent = {"details": {"status": "sent", "messageId": "m-1"}, "content": [{"type": "text", "text": "sent"}]}
    d.feed(result("r1", 1, "sessions_send", "c1", result=sent))
    (record,) = d.state().history
    assert record.result_hash == sha({"status": "sent"})
    assert record.kind == KIND_VOLATILE_SEND


def _calls_that_leave_the_history(d: Driver, tool: str, args: dict, n: int, size: int) -> list[str]:
    """`n` calls of (tool, args) with no result yet, then `size` other finished
    calls, which push them out of the history; returns their call ids."""
    ids = [f"late{i}" for i in range(n)]
    for call_id in ids:
        d.call(tool, args, call_id=call_id)
    for i in range(size):
        d.call("write", {"n": i})
        d.result("write", result=txt(i))
    return ids


def test_result_of_a_call_that_left_the_history_takes_its_args_hash():
    """Ten reads still running while thirty other calls finish: when their
    results come, without args, each takes its call's args hash (spec §6), as
    the gateway does, which still holds the call's params."""
    d = Driver(fleet(enabled=True, historySize=30))
    ids = _calls_that_leave_the_history(d, "read", {"path": "a"}, 10, 30)
    assert set(d.state().unfinished) == set(ids)
    for call_id in ids:
        d.result("read", call_id, result=SAME)
    assert d.state().unfinished == {}
    assert [r.args_hash for r in d.state().history[-10:]] == [expected_args_hash("read", {"path": "a"})] * 10
    v = d.call("read", {"path": "a"})
    assert (v.decision, v.detector, v.count) == ("warn", "generic_repeat", 10)


def test_a_poll_that_left_the_history_is_still_hashed_as_a_poll():
    d = Driver(fleet(enabled=True, historySize=30))
    poll = {"action": "poll", "sessionId": "s1"}
    (call_id,) = _calls_that_leave_the_history(d, "process", poll, 1, 30)
    state = restored(stored(d.state()))  # kept across a restart, too
    d.states["r1"] = state
    running = {"details": {"status": "running", "pid": 7}, "content": [{"type": "text", "text": "..."}]}
    d.result("process", call_id, result=running)
    record = d.state().history[-1]
    assert record.kind == KIND_PROCESS_POLL
    assert record.args_hash == expected_args_hash("process", poll)
    assert record.result_hash == sha(
        {"action": "poll", "status": "running", "exitCode": None, "exitSignal": None, "aggregated": None, "text": "..."}
    )


def test_unfinished_calls_are_bounded_and_freed_by_run_end():
    d = Driver(fleet(enabled=True, historySize=1))
    for i in range(MAX_UNFINISHED + 5):
        d.call("read", {"i": i}, call_id=f"c{i}")
    unfinished = d.state().unfinished  # all but the newest call left the history; the oldest four went first
    assert list(unfinished) == [f"c{i}" for i in range(4, MAX_UNFINISHED + 4)]
    d.end()
    assert d.state().unfinished == {}


def test_a_state_stored_before_unfinished_existed_still_decodes():
    old = msgspec.msgpack.encode([0.0, {"last_seq": 4, "history": [["read", "read:x", "c1", 0, None, None]]}])
    state = restored(old)
    assert state.unfinished == {} and state.last_seq == 4 and state.history[0].call_id == "c1"


def test_result_with_different_args_does_not_fill_and_is_appended():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    d.feed(result("r1", 2, "read", "c1", args={"p": 2}, result=txt("a")))
    history = d.state().history
    assert len(history) == 2
    assert history[0].result_hash is None
    assert history[1].args_hash == expected_args_hash("read", {"p": 2})
    assert history[1].result_hash == sha({"details": {}, "text": "a"})


def test_result_with_same_args_fills():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    d.feed(result("r1", 2, "read", "c1", args={"p": 1}, result=txt("a")))
    assert len(d.state().history) == 1 and d.state().history[0].result_hash is not None


def test_result_with_no_matching_call_is_appended_and_counts():
    d = Driver(low())
    for i in range(5):
        d.feed(result("r1", d.next_seq("r1"), "exec", f"orphan{i}", args={"c": 1}, result=SAME))
    assert len(d.state().history) == 5
    v = d.call("exec", {"c": 1})
    assert (v.decision, v.detector, v.count) == ("block", "generic_repeat", 5)


def test_result_for_already_finished_call_is_appended():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    d.feed(result("r1", 2, "read", "c1", result=txt("a")))
    d.feed(result("r1", 3, "read", "c1", result=txt("b")))
    history = d.state().history
    assert len(history) == 2
    assert history[0].result_hash == sha({"details": {}, "text": "a"})
    assert history[1].result_hash == sha({"details": {}, "text": "b"})


def test_result_without_outcome_changes_nothing():
    d = Driver(low())
    d.feed(call("r1", 1, "read", {"p": 1}, call_id="c1"))
    before = stored(d.state())
    assert d.feed(result("r1", 2, "read", "c1")) == []
    assert d.feed(result("r1", 3, "read", "c1", error=None)) == []
    after = d.state()
    assert len(after.history) == 1 and after.history[0].result_hash is None
    expected = restored(before)
    expected.last_seq = 3  # only the seq moved on
    assert after == expected


def test_veto_result_does_not_reset_streak_and_adds_to_it_once_confirmed():
    """Another guard's veto of the fifth call makes it a veto record: pending
    until the next identical outcome, which counts it (spec §7.2)."""
    d = Driver(low(), NO_RECOVERY)
    for _ in range(4):
        d.step("exec", {"c": 1}, res=SAME)
    d.call("exec", {"c": 1})  # fifth identical call, warned
    d.result("exec", result={"details": {"status": "blocked", "deniedReason": "tool-loop"}})
    d.step("exec", {"c": 1}, res=SAME)
    v = d.call("exec", {"c": 1})
    assert (v.decision, v.count) == ("block", 6)


def test_open_call_does_not_break_streak_but_counts_as_recent():
    d = Driver(low())
    for _ in range(2):
        d.step("exec", {"c": 1}, res=SAME)
    d.call("exec", {"c": 1})  # never answered
    v = d.call("exec", {"c": 1})
    assert (v.detector, v.count) == ("generic_repeat", 3)


# --- duplicates ---------------------------------------------------------------------------------------------


def test_duplicate_changes_nothing_and_gives_no_verdict():
    d = Driver(low())
    for _ in range(4):
        d.step("exec", {"c": 1}, res=SAME)
    before = stored(d.state())
    for event in [
        call("r1", 1, "exec", {"c": 1}),
        call("r1", 8, "exec", {"c": 99}),
        result("r1", 8, "exec", "k4", result=txt("new")),
        compaction("r1", 2),
        run_end("r1", 5),
    ]:
        outcome = apply(d.state(), event, low())
        assert outcome.duplicate is True
        assert outcome.verdicts == []
        assert stored(outcome.state) == before


def test_seq_gaps_are_fine():
    d = Driver(low())
    assert d.feed(call("r1", 10, "read", {}))[0].decision == "allow"
    assert apply(d.state(), call("r1", 100, "read", {}), low()).duplicate is False


# --- wire decoding ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1,2]",
        b'{"type":"tool_cal","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t"}',
        b'{"run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","seq":1,"tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","run_id":"","seq":1,"tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","run_id":"r","seq":-1,"tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","run_id":"r","seq":"1","tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","run_id":7,"seq":1,"tool_call_id":"c","tool_name":"t"}',
        b'{"type":"tool_call","run_id":"r","seq":1,"tool_name":"t"}',
        b'{"type":"run_end","run_id":"r"}',
    ],
)
def test_malformed_events_refused(line):
    with pytest.raises(BadEvent):
        decode_event(line)


_DEEP = f"not a JSON event: nested deeper than {MAX_DEPTH} levels"
_HEAD = b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","args":'


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 300,  # shorter than a valid event that deep could be: refused as too deep all the same
        b'{"type":"bogus","args":' + b"[" * 300,  # not "unknown event type"
        b'{"type":"tool_call","args":' + b"{" * 280 + b"}",
        _HEAD + b"[" * 257 + b"]" * 257 + b"}",  # valid JSON, 258 deep
    ],
)
def test_too_deep_is_the_reason_however_short_or_malformed(line):
    with pytest.raises(BadEvent, match="nested deeper"):
        decode_event(line)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(240, 270),
    st.sampled_from([b"[", b'{"a":', b'[{"b":']),
    st.integers(0, 600),
    st.sampled_from([_HEAD, b'{"type":"bogus","args":', b"", b'{"type":"run_end","args":']),
)
def test_decode_refuses_as_too_deep_exactly_when_too_deep(depth, opener, cut, head):
    """Short input is checked for depth only when it fails to decode: the
    reason given must be the same as when every input was checked first."""
    closer = b"]" if opener == b"[" else (b"}" if opener == b'{"a":' else b"}]")
    data = head + opener * depth + b"1" + closer * depth + (b"}" if head else b"")
    data = data[: len(data) - cut]
    try:
        decode_event(data)
        reason = None
    except BadEvent as exc:
        reason = str(exc)
    assert (reason == _DEEP) == _too_deep(data)


@pytest.mark.parametrize(
    ("escaped", "kept"),
    [
        (r"cut \ud83d", "cut "),  # a high half at the end: an emoji cut by slice()
        (r"\ude00 tail", " tail"),  # a low half alone
        (r"\ud83d\ud83d\ude00", "\U0001f600"),  # the first high half is alone; the pair stays
        (r"a\ud83d\ude00b", "a\U0001f600b"),  # a pair is one character
        (r"\\ud800", "\\ud800"),  # an escaped backslash, then text: no escape at all
        (r"\\\ud800", "\\"),  # an escaped backslash, then a lone half
    ],
)
def test_unpaired_surrogate_escapes_are_dropped_as_the_reference_drops_them(escaped, kept):
    """Valid JSON that no Unicode string can hold: the reference gateway drops
    unpaired surrogates from every string it hashes, and so does the decoder."""
    line = '{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","args":{"s":"' + escaped + '"}}'
    event = decode_event(line.encode())
    assert event.args == {"s": kept}
    assert call_signature(event) == expected_args_hash("t", {"s": kept})
    (verdict,) = apply(None, event, low()).verdicts
    assert verdict.decision == "allow"


def test_an_unpaired_surrogate_does_not_hide_another_fault():
    line = rb'{"type":"tool_call","run_id":"r","tool_call_id":"c","tool_name":"t","args":{"s":"\ud800"},"seq":"1"}'
    with pytest.raises(BadEvent, match=r"Expected `int`, got `str` - at `\$.seq`"):
        decode_event(line)


def test_optional_fields_accepted():
    event = decode_event(
        b'{"type":"tool_result","run_id":"r","seq":0,"tool_call_id":"c","tool_name":"t","error":null,'
        b'"result":{"content":[]},"ts":"2026-01-01T00:00:00Z","unknown_tool_name":null}'
    )
    assert event.seq == 0 and event.error is None
    assert decode_event(b'{"type":"compaction","run_id":"r","seq":3,"agent_id":"a","ts":1.5}').agent_id == "a"


def test_ping_pong_through_engine():
    d = Driver(low())
    a, b = ("read", {"p": 1}), ("exec", {"c": 1})
    verdicts = []
    for i in range(5):
        tool, args = (a, b)[i % 2]
        verdicts.append(d.step(tool, args, res=SAME))
    assert [(v.decision, v.detector, v.count) for v in verdicts] == [
        ("allow", None, 0),
        ("allow", None, 0),
        ("warn", "ping_pong", 3),
        ("allow", "ping_pong", 4),
        ("block", "ping_pong", 5),
    ]
    key = "pingpong:" + "|".join(sorted([expected_args_hash(*a), expected_args_hash(*b)]))
    assert {v.warning_key for v in verdicts[2:]} == {key}
    assert [v.paired_tool_name for v in verdicts[2:]] == ["exec", "read", "exec"]
    assert json.loads(encode_verdict(verdicts[4]))["paired_tool_name"] == "exec"
    assert "read" in verdicts[4].message and "exec" in verdicts[4].message
