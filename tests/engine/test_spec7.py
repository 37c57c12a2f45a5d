"""Spec §7: veto records, no-progress outcomes, exec failures across arguments,
stable untrusted-content markers, argument churn, and the two places where
loopwarden stays stricter than the reference (§7.4)."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from builders import (
    NO_RECOVERY,
    Driver,
    call,
    expected_args_hash,
    fleet,
    low,
    restored,
    result,
    sha,
    stored,
    text_result,
)
from schemas.state import NO_PROGRESS, TERMINAL_FAILURE, VETO, Record, RunState
from streams.engine import apply
from streams.engine.detectors import (
    Streak,
    argument_churn,
    detect,
    exec_failure_streak,
    no_progress_streak,
    ping_pong,
    unknown_tool_streak,
)
from streams.engine.hashing import failure_shape, hash_result, wire_fields
from streams.engine.stablejson import decode_payload, python_outcome_json

VETO_RESULT = {"details": {"status": "blocked", "deniedReason": "tool-loop"}}
DEFAULTS = fleet(enabled=True)
A, B, C, D = "exec:aaa", "exec:bbb", "exec:ccc", "exec:ddd"


def rec(sig: str, result: str | None = None, flags: int = 0, identity: str | None = None, tool: str | None = None):
    return Record(tool or sig.split(":")[0], sig, None, 0, result, None, flags, identity)


def veto(sig: str, tool: str | None = None) -> Record:
    return rec(sig, flags=VETO, tool=tool)


def fail(sig: str, result: str, identity: str | None = None) -> Record:
    return rec(sig, result, TERMINAL_FAILURE, identity)


def exec_failure(output: str, code: int = 1) -> dict[str, Any]:
    return {"details": {"status": "failed", "exitCode": code, "aggregated": output}}


def wrap(marker_id: str, body: str, quote: str = '"') -> str:
    return (
        f"<<<EXTERNAL_UNTRUSTED_CONTENT id={quote}{marker_id}{quote}>>>{body}"
        f"<<<END_EXTERNAL_UNTRUSTED_CONTENT id={quote}{marker_id}{quote}>>>"
    )


def hashed(tool: str, args: Any = UNSET, res: Any = UNSET, err: Any = UNSET):
    return hash_result(tool, args, decode_payload(msgspec.json.encode(res)) if res is not UNSET else UNSET, err)


# --- §7.1 outcomes ----------------------------------------------------------------------------------


def test_errors_and_unchanged_writes_are_no_progress():
    assert hashed("read", {}, err="ENOENT").no_progress
    unchanged = hashed("write", {"path": "a"}, {"details": {"changed": False, "path": "a", "at": 1}})
    assert unchanged.no_progress and unchanged.result_hash == sha({"status": "unchanged"})
    # only exactly false; other tools' unchanged results hash as usual
    assert not hashed("write", {}, {"details": {"changed": 0}}).no_progress
    assert hashed("edit", {}, {"details": {"changed": False}}).result_hash != unchanged.result_hash
    assert not hashed("read", {}, text_result("x")).no_progress


def test_the_engine_records_the_outcome_flags():
    d = Driver(low())
    d.step("read", {"p": 1}, err="ENOENT")
    d.step("exec", {"c": 1}, res=exec_failure("boom"))
    d.step("write", {"p": 1}, res={"details": {"changed": False}})
    errored, failed, unchanged = d.state().history
    assert errored.flags == NO_PROGRESS and failed.flags == TERMINAL_FAILURE and unchanged.flags == NO_PROGRESS
    assert failed.failure_identity == hashed("exec", {}, exec_failure("boom")).failure_identity is not None


@pytest.mark.parametrize(
    ("details", "terminal"),
    [
        ({"status": "failed", "exitCode": 2, "aggregated": "error: x"}, True),
        ({"status": "completed", "exitCode": -1, "aggregated": "  error: x  "}, True),
        ({"status": "completed", "exitCode": 1.5, "aggregated": "error: x"}, True),
        ({"status": "failed", "exitCode": 0, "aggregated": "error: x"}, False),  # exit 0
        ({"status": "failed", "exitCode": 2, "aggregated": "error: x", "timedOut": True}, False),
        ({"status": "failed", "exitCode": 2, "aggregated": "   "}, False),  # no output
        ({"status": "failed", "exitCode": 2, "aggregated": "(Command exited with code 2)"}, False),
        ({"status": "failed", "exitCode": 3, "aggregated": "(Command exited with code 2)"}, True),
        ({"status": "failed", "exitCode": "2", "aggregated": "error: x"}, False),  # not a number
        ({"status": "running", "exitCode": 2, "tail": "error: x"}, False),
    ],
)
def test_terminal_exec_failures(details, terminal):
    out = hashed("exec", {}, {"details": details})
    assert (out.outcome_kind == "terminal_failure") is terminal
    assert (out.failure_identity is not None) is terminal
    assert not out.no_progress
    assert hashed("run", {}, {"details": details}).outcome_kind is None  # exec only


def test_non_finite_exit_code_is_not_a_terminal_failure():
    payload = decode_payload(b'{"details":{"status":"failed","exitCode":1e400,"aggregated":"x"}}')
    assert hash_result("exec", {}, payload, UNSET).outcome_kind is None


def test_failure_shape_replaces_volatile_parts_in_order():
    assert failure_shape("at 2026-09-01T12:00:00.123+02:00 and 2026-09-01 12:00:00z") == "at # and #"
    assert failure_shape("12:00:01.5 then 1:02:03") == "# then #"
    assert failure_shape("Attempt #3, RETRY=4, retry: 5; reattempt 6") == "#, #, #; reattempt 6"
    assert failure_shape("took 15ms, 3.5 s, 2 Seconds, 1 minute, 4 hours, 7ns, 10us, 4sx") == (
        "took #, #, #, #, #, #, #, 4sx"
    )
    assert failure_shape("PID 42, ppid: 7, pid=9, rapid 3") == "#, #, #, rapid 3"
    # the reference's /iu: the long s is an "s", and the Kelvin sign a word character
    assert failure_shape("2 \u017feconds") == "#"
    assert failure_shape("\u212apid 4") == "\u212apid 4"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 99999), st.integers(0, 23), st.integers(0, 59), st.integers(0, 999)),
        min_size=2,
        max_size=2,
    ),
    st.integers(1, 255),
)
def test_failure_identity_ignores_pids_times_durations_and_attempts(runs, code):
    """Property: two runs of one failing command differ only in their pids, time
    stamps, durations and attempt numbers: one identity, two result hashes."""
    outputs = [
        f"[{h:02d}:{m:02d}:{m:02d}] worker pid={pid} attempt {pid % 7} failed after {ms}ms\n"
        f"2026-09-0{1 + h % 9}T{h:02d}:{m:02d}:00Z ERROR connection refused (exit {code})"
        for pid, h, m, ms in runs
    ]
    first, second = (hashed("exec", {}, exec_failure(o, code)) for o in outputs)
    assert first.failure_identity == second.failure_identity is not None
    assert (first.result_hash == second.result_hash) == (outputs[0] == outputs[1])
    other_code = hashed("exec", {}, exec_failure(outputs[0], code + 1))
    assert other_code.failure_identity != first.failure_identity


# --- §7.1 stable markers ----------------------------------------------------------------------------

ID1, ID2 = "0123456789abcdef", "fedcba9876543210"


@pytest.mark.parametrize(
    ("quote", "body"),
    [
        ('"', 'page said "hi"'),
        ('\\"', 'page said \\"hi\\"'),  # one level of JSON escaping, consistently
        ('\\\\\\"', "plain"),  # three backslashes: two levels
    ],
)
def test_markers_with_consistent_escaping_are_made_stable(quote, body):
    first = hashed("web_fetch", {"url": "u"}, text_result(wrap(ID1, body, quote)))
    second = hashed("web_fetch", {"url": "u"}, text_result(wrap(ID2, body, quote)))
    assert first.result_hash == second.result_hash
    assert first.result_hash == hashed("web_fetch", {}, text_result(wrap("0" * 16, body, quote))).result_hash


@pytest.mark.parametrize(
    ("quote", "body"),
    [
        ('\\\\"', "plain"),  # two backslashes: not a whole number of escaping levels
        ('\\"', 'page said "hi"'),  # an unescaped quote inside an escaped wrap
        ('"', "x"),  # (second id below differs from the first)
    ],
)
def test_markers_with_inconsistent_escaping_are_left_as_they_are(quote, body):
    if quote == '"':
        text = wrap(ID1, body).replace(
            f'END_EXTERNAL_UNTRUSTED_CONTENT id="{ID1}"', f'END_EXTERNAL_UNTRUSTED_CONTENT id="{ID2}"'
        )
        other = text.replace(ID1, "a" * 16)
    else:
        text, other = wrap(ID1, body, quote), wrap(ID2, body, quote)
    assert (
        hashed("web_fetch", {}, text_result(text)).result_hash
        != hashed("web_fetch", {}, text_result(other)).result_hash
    )


def test_markers_are_stable_in_keys_errors_and_every_outcome_but_not_in_args():
    keyed = [hashed("read", {}, {"details": {wrap(i, "k"): 1}}).result_hash for i in (ID1, ID2)]
    assert keyed[0] == keyed[1]
    errors = [hashed("read", {}, err=wrap(i, "denied")).result_hash for i in (ID1, ID2)]
    assert errors[0] == errors[1]
    # two keys that become one when made stable are both kept, in the original keys' order
    both = {wrap(ID2, "k"): 2, wrap(ID1, "k"): 1}
    assert python_outcome_json(both).count(b"0000000000000000") == 4
    assert python_outcome_json(both).index(b":1") < python_outcome_json(both).index(b":2")
    assert expected_args_hash("read", {"q": wrap(ID1, "x")}) != expected_args_hash("read", {"q": wrap(ID2, "x")})


def test_marker_outcomes_take_the_python_definition():
    from streams.engine import stablejson

    if stablejson.speedups is None:
        pytest.skip("built without the C extension")
    value = {"text": wrap(ID1, "x")}
    assert stablejson.speedups.outcome_digest(value) is None
    assert stablejson.speedups.outcome_digest({"text": "x"}) == stablejson.speedups.stable_digest({"text": "x"})


# --- §7.1 veto records --------------------------------------------------------------------------------


def looping(d: Driver, times: int, tool: str = "exec", args: Any = None, **outcome: Any) -> list[Any]:
    """`times` identical calls; each allowed one gets `outcome` as its result."""
    out = outcome or {"res": text_result("same")}
    return [d.step(tool, args or {"c": 1}, **out) for _ in range(times)]


def test_a_blocked_call_leaves_a_veto_record_and_its_veto_result_changes_nothing():
    quiet, reporting = Driver(low()), Driver(low())
    for d in (quiet, reporting):
        looping(d, 5)
        assert d.call("exec", {"c": 1}).decision == "block"
    before = stored(reporting.state())
    assert reporting.result("exec", result=VETO_RESULT) == []
    after = restored(stored(reporting.state()))
    after.last_seq = restored(before).last_seq
    assert stored(after) == before
    assert [r.flags for r in quiet.state().history[-2:]] == [0, VETO]
    assert quiet.state().history == reporting.state().history


def test_a_veto_record_that_left_the_history_still_takes_its_veto_result():
    d = Driver(low(historySize=6))
    looping(d, 5)
    assert d.call("exec", {"c": 1}, call_id="blocked").decision == "block"
    for i in range(6):
        d.step("read", {"i": i}, res=text_result("x"))
    assert "blocked" in d.state().unfinished
    history = list(d.state().history)
    assert d.result("exec", "blocked", result=VETO_RESULT) == []
    assert d.state().history == history and "blocked" not in d.state().unfinished


def test_another_guards_veto_completes_the_open_call_or_is_appended():
    d = Driver(low())
    d.call("read", {"p": 1}, call_id="open")
    d.result("read", "open", result=VETO_RESULT)
    d.result("write", "never-called", result=VETO_RESULT, args={"p": 2})
    first, appended = d.state().history
    assert (first.call_id, first.flags, first.result_hash) == ("open", VETO, None)
    assert (appended.args_hash, appended.flags) == (expected_args_hash("write", {"p": 2}), VETO)


def test_a_result_for_a_vetoed_call_is_a_new_record_of_that_call():
    d = Driver(low())
    looping(d, 5)
    assert d.call("exec", {"c": 1}, call_id="ran-anyway").decision == "block"
    d.result("exec", "ran-anyway", result=text_result("same"))
    *_, vetoed, ran = d.state().history
    assert (
        vetoed.flags == VETO
        and ran.flags == 0
        and ran.args_hash == vetoed.args_hash == expected_args_hash("exec", {"c": 1})
    )


def test_results_of_blocked_calls_without_args_leave_the_run_where_results_with_args_do():
    """A gateway that answers every call, blocked ones too, with a result
    without args: each takes its call's args hash, so the loop stays blocked
    exactly as with results that name their args (spec §6)."""
    runs = []
    for with_args in (True, False):
        d = Driver(low(), NO_RECOVERY)
        decisions = []
        for _ in range(12):
            decisions.append(d.call("exec", {"c": 1}).decision)
            d.result("exec", result=text_result("same"), **({"args": {"c": 1}} if with_args else {}))
        runs.append((decisions, [(r.args_hash, r.flags, r.result_hash) for r in d.state().history]))
    assert runs[0] == runs[1]
    assert runs[1][0][5:] == ["block"] * 7
    assert {args for args, _, _ in runs[1][1]} == {expected_args_hash("exec", {"c": 1})}


def test_an_abort_leaves_no_record_and_the_guard_never_observes_vetoes():
    d = Driver(low(detectors={"genericRepeat": False, "pingPong": False}))
    d.compact()
    d.step("read", {"p": 1}, res=text_result("x"))
    d.call("read", {"p": 1})
    assert d.result("read", result=VETO_RESULT) == []  # not observed: the window still holds one triple
    assert d.state().guard_remaining == 2
    d.step("read", {"p": 1}, res=text_result("x"))
    assert d.step("read", {"p": 1}, res=text_result("x")).decision == "allow"
    assert d.state().aborted is not None  # the third identical triple aborted the run
    size = len(d.state().history)
    assert d.call("read", {"p": 1}).decision == "abort"
    assert len(d.state().history) == size


def test_records_stored_before_the_new_fields_decode():
    old = msgspec.msgpack.encode([0.0, {"last_seq": 3, "history": [["exec", A, "c1", 0, "r1", None]]}])
    state = restored(old)
    assert state.history == [Record("exec", A, "c1", 0, "r1", None, 0, None)]


# --- §7.2 the no-progress streak ----------------------------------------------------------------------


def test_vetoes_count_once_an_outcome_confirms_them_or_alone():
    assert no_progress_streak([rec(A, "r"), veto(A), rec(A, "r"), veto(A)]) == Streak(4, "r")
    assert no_progress_streak([veto(A), rec(A, "r"), rec(A, "r")]) == Streak(2, "r")  # older vetoes are not counted
    assert no_progress_streak([rec(A, "x"), veto(A), rec(A, "r")]) == Streak(1, "r")
    assert no_progress_streak([veto(A), veto(A), rec(A)]) == Streak(2, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["r1", "r2", None, "veto"]), max_size=20), st.integers(0, 10))
def test_each_newer_veto_adds_one(kinds, vetoes):
    """Property: vetoes after the newest record always add one each."""
    history = [veto(A) if k == "veto" else rec(A, k) for k in kinds]
    before = no_progress_streak(history)
    after = no_progress_streak(history + [veto(A)] * vetoes)
    assert after == Streak(before.length + vetoes, before.result_hash)


def test_a_veto_only_streak_reaches_the_breaker():
    """Another guard vetoes every call: no outcome at all, and still the run
    reaches the global circuit breaker (key names no result)."""
    d = Driver(low(detectors={"genericRepeat": False}))
    for _ in range(7):
        assert d.call("exec", {"c": 1}).decision == "allow"
        d.result("exec", result=VETO_RESULT)
    v = d.call("exec", {"c": 1})
    assert (v.decision, v.detector, v.count) == ("block", "global_circuit_breaker", 7)
    assert v.warning_key == f"global:exec:{expected_args_hash('exec', {'c': 1})}:none"
    assert "7 times in a row with identical arguments, each call vetoed" in v.message


def test_the_engines_own_vetoes_take_a_blocked_repeat_to_the_breaker():
    d = Driver(low(), NO_RECOVERY)
    verdicts = looping(d, 12)
    assert [(v.decision, v.detector, v.count) for v in verdicts[5:]] == (
        [("block", "generic_repeat", 5), ("block", "generic_repeat", 6)]
        + [("block", "global_circuit_breaker", n) for n in range(7, 12)]
    )


def test_exec_walk_stops_where_it_returns_to_the_original_args():
    # newest last; the new call is A
    assert exec_failure_streak([fail(A, "f", "i"), fail(B, "g", "i"), fail(C, "h", "i")], A) == Streak(2, "h")
    assert exec_failure_streak([fail(A, "f", "i"), fail(A, "f", "i"), fail(B, "g", "i")], A) == Streak(1, "g")
    assert exec_failure_streak([fail(B, "g", "i"), fail(A, "f", "i"), fail(A, "f", "i")], A) == Streak(3, "f")
    assert exec_failure_streak([fail(A, "f", "i"), fail(B, "g", "j"), fail(B, "f", "j")], A) == Streak(2, "f")
    assert exec_failure_streak([fail(B, "g", "i"), fail(B, "f", "j")], A) == Streak(1, "f")  # neither equal


def test_exec_walk_stops_at_other_tools_and_outcomes_and_counts_vetoes():
    assert exec_failure_streak([fail(B, "f", "i"), rec("read:x", "r", tool="read"), fail(C, "f", "i")], A) == Streak(
        1, "f"
    )
    assert exec_failure_streak([fail(B, "f", "i"), rec(B, "ok"), fail(C, "f", "i")], A) == Streak(1, "f")
    assert exec_failure_streak([fail(B, "f", "i"), fail(C, "g", "k")], A) == Streak(1, "g")  # another failure
    assert exec_failure_streak([fail(B, "f", "i"), veto(C), rec(C), fail(C, "g", "i")], A) == Streak(3, "g")
    assert exec_failure_streak([veto(B), veto(C)], A) == Streak(0, None)  # vetoes alone: not this walk's


def test_exec_failing_the_same_way_across_flags_is_blocked():
    d = Driver(low(detectors={"pingPong": False}), NO_RECOVERY)
    verdicts = [
        d.step("exec", {"command": f"pytest -x --maxfail={i}"}, res=exec_failure(f"FAILED in {i}.{i}s (pid {100 + i})"))
        for i in range(7)
    ]
    assert [v.decision for v in verdicts] == ["allow"] * 5 + ["block"] * 2
    assert (verdicts[5].detector, verdicts[5].count) == ("generic_repeat", 5)
    assert "across argument variants" in verdicts[5].message
    assert verdicts[6].detector == "generic_repeat"  # still 5: the veto is of other args, pending


def test_the_longer_walk_wins_and_names_its_result():
    history = [
        fail(A, "f", "i"),
        fail(B, "g", "i"),
        fail(C, "h", "i"),
        fail(D, "k", "i"),
        fail(B, "g", "i"),
        fail(C, "h", "i"),
    ]
    found = detect(
        history, "exec", A, False, low(detectors={"pingPong": False}).default, Counter(r.args_hash for r in history)
    )
    assert found is not None and found.count == 5 and found.warning_key == f"generic:exec:{A}:h"
    assert no_progress_streak([history[0]]).length == 1  # the per-args walk: shorter


# --- §7.3 argument churn ------------------------------------------------------------------------------

E = "error:same"


def np_rec(sig: str, result: str = E) -> Record:
    return rec(sig, result, NO_PROGRESS, tool="edit")


X, Y, Z = "edit:x", "edit:y", "edit:z"


def test_churn_needs_two_stable_variants_and_one_shared_outcome():
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y)] * 3, "edit", X).count == 6
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y)] * 3, "edit", X).variants == 2
    assert argument_churn([np_rec(X)] * 6, "edit", X).count == 0  # one variant
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y)] * 2, "edit", X).count == 0  # Y not stable
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y, "error:other")] * 3, "edit", X).count == 0
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y)] * 3, "edit", Z).count == 0  # the call is not a variant
    assert argument_churn([np_rec(X)] * 3 + [np_rec(Y)] * 3 + [np_rec(Z)], "edit", X).count == 0


def test_churn_walk_stops_and_skips():
    base = [np_rec(X)] * 3 + [np_rec(Y)] * 3
    assert argument_churn(base + [veto(X, tool="edit"), rec(Y, tool="edit")], "edit", X).count == 6
    assert argument_churn(base + [rec(Y, "ok", tool="edit")], "edit", X).count == 0  # progress ends it
    assert argument_churn(base + [rec("read:q", "r", tool="read")], "edit", X).count == 0
    # an older outcome of a variant that differs ends the walk before it
    assert argument_churn([np_rec(X, "error:old")] + base, "edit", X).count == 6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([X, Y, Z]), st.sampled_from([E, "error:b", None])), max_size=25))
def test_churn_counts_only_stable_variants_of_one_outcome(steps):
    """Property: churn is 0, or counts at least two variants of three calls each."""
    history = [np_rec(sig, result) if result else rec(sig, tool="edit") for sig, result in steps]
    churn = argument_churn(history, "edit", X)
    assert churn.count == 0 or (churn.variants >= 2 and churn.count >= 3 * churn.variants)
    assert churn.count <= sum(1 for _, result in steps if result)


def test_churn_warns_after_row_7_before_row_8_and_never_blocks():
    d = Driver(low(detectors={"pingPong": False}), NO_RECOVERY)
    for args in [{"old": "a"}] * 3 + [{"old": "b"}] * 3:
        d.step("edit", args, err="old_string not found in file")
    v = d.call("edit", {"old": "a"})
    assert (v.decision, v.detector, v.count, v.warning_key) == ("warn", "argument_churn", 6, "argument-churn:edit")
    assert "2 argument variants" in v.message and "still allowed" in v.message
    d.result("edit", error="old_string not found in file")
    for _ in range(12):
        d.step("edit", {"old": "b"}, err="old_string not found in file")
    # a longer streak of one variant is generic_repeat's (row 7): it blocks
    assert d.call("edit", {"old": "b"}).detector == "global_circuit_breaker"
    off = Driver(low(detectors={"pingPong": False, "argumentChurn": False}))
    for args in [{"old": "a"}] * 3 + [{"old": "b"}] * 3:
        off.step("edit", args, err="old_string not found in file")
    assert off.call("edit", {"old": "a"}).detector == "generic_repeat"  # row 8: recent count 3


# --- §7.4 where loopwarden stays stricter -------------------------------------------------------------


def test_unknown_tool_streak_skips_vetoes_of_the_tool():
    u = Record("ghost", "ghost:1", None, 0, "error:x", "ghost", NO_PROGRESS)
    assert unknown_tool_streak([u, u, veto("ghost:1"), u, veto("ghost:2")], "ghost") == (3, "ghost")
    assert unknown_tool_streak([u, veto("other:1"), u], "ghost") == (1, "ghost")  # another tool's veto ends it


def test_ping_pong_evidence_skips_vetoes_but_needs_real_outcomes_on_both_sides():
    R, W = "read:a", "read:b"
    tail = [rec(R, "x", tool="read"), rec(W, "y", tool="read"), veto(R, tool="read"), rec(W, "y", tool="read")]
    assert ping_pong(tail, R).no_progress and ping_pong(tail, R).count == 5
    only_vetoes = [veto(R, tool="read"), rec(W, "y", tool="read"), veto(R, tool="read"), rec(W, "y", tool="read")]
    assert ping_pong(only_vetoes, R).count == 5 and not ping_pong(only_vetoes, R).no_progress
    changed = [rec(R, "x", tool="read"), rec(W, "y", tool="read"), rec(R, "z", tool="read"), veto(W, tool="read")]
    assert not ping_pong(changed, W).no_progress


# --- regression: the five stories of the issue, with the default thresholds ---------------------------


def run_story(d: Driver, calls: list[tuple[str, Any, dict[str, Any]]]) -> list[Any]:
    return [d.step(tool, args, **outcome) for tool, args, outcome in calls]


def first(verdicts: list[Any], decision: str) -> int | None:
    return next((i + 1 for i, v in enumerate(verdicts) if v.decision == decision), None)


def test_story_blocked_call_kept_trying_reaches_the_breaker():
    verdicts = looping(Driver(DEFAULTS, NO_RECOVERY), 40)
    assert first(verdicts, "block") == 21 and all(v.decision == "block" for v in verdicts[20:])
    assert [v.detector for v in verdicts[29:31]] == ["generic_repeat", "global_circuit_breaker"]


def test_story_exec_with_slightly_different_flags_failing_the_same_way():
    calls = [
        (
            "exec",
            {"command": f"npm test -- --seed={i}"},
            {
                "res": exec_failure(
                    f"[{i % 24:02d}:00:0{i % 10}] pid {4000 + i}: Error: ECONNREFUSED after {i}ms\nattempt {i}"
                )
            },
        )
        for i in range(30)
    ]
    verdicts = run_story(Driver(DEFAULTS), calls)
    assert first(verdicts, "block") == 21 and verdicts[20].detector == "generic_repeat"


def test_story_tool_cycled_through_variants_that_fail_identically():
    calls = [("edit", {"old": variant}, {"err": "old_string not found"}) for variant in "aaaabbbbcccc"]
    verdicts = run_story(Driver(DEFAULTS), calls)
    warned = [(i + 1, v.detector, v.count) for i, v in enumerate(verdicts) if v.decision == "warn"]
    assert warned == [(12, "argument_churn", 11)]


def test_story_writes_that_change_nothing():
    calls = [
        (
            "write",
            {"path": "a.txt", "content": "x"},
            {"res": text_result(f"unchanged at {i}", {"changed": False, "checkedAt": i})},
        )
        for i in range(25)
    ]
    verdicts = run_story(Driver(DEFAULTS), calls)
    assert first(verdicts, "block") == 21


def test_story_external_content_with_a_fresh_marker_id_each_fetch():
    calls = [
        (
            "web_fetch",
            {"url": "https://example.com"},
            {"res": text_result(wrap(hashlib.sha256(bytes([i])).hexdigest()[:16], "same page"))},
        )
        for i in range(25)
    ]
    verdicts = run_story(Driver(DEFAULTS), calls)
    assert first(verdicts, "block") == 21 and verdicts[20].detector == "generic_repeat"


# --- regression: the holes of the reference stay closed -----------------------------------------------


def test_ping_pong_of_two_failing_reads_stays_blocked():
    calls = [("read", {"path": "ab"[i % 2]}, {"err": "ENOENT: no such file"}) for i in range(40)]
    verdicts = run_story(Driver(DEFAULTS, NO_RECOVERY), calls)
    assert first(verdicts, "block") == 20 and all(v.decision == "block" for v in verdicts[19:])
    assert {v.detector for v in verdicts[19:]} == {"ping_pong"}


def test_missing_tool_stays_blocked():
    calls = [("web_serch", {"q": i}, {"err": "Unknown tool: web_serch"}) for i in range(30)]
    verdicts = run_story(Driver(DEFAULTS, NO_RECOVERY), calls)
    assert first(verdicts, "block") == 11 and all(v.decision == "block" for v in verdicts[10:])
    assert {v.detector for v in verdicts[10:]} == {"unknown_tool_repeat"}


def test_plain_repeat_stays_blocked():
    verdicts = looping(Driver(DEFAULTS, NO_RECOVERY), 45, "read", {"path": "same"})
    assert first(verdicts, "block") == 21 and all(v.decision == "block" for v in verdicts[20:])


# --- §7.5 gateways that hash locally ------------------------------------------------------------------

STORY_CALLS = (
    [("exec", {"command": f"make -j{i}"}, {"res": exec_failure(f"error at 12:00:0{i} pid {i}")}) for i in range(8)]
    + [("write", {"path": "a"}, {"res": {"details": {"changed": False, "at": i}}}) for i in range(8)]
    + [("edit", {"old": v}, {"err": "old_string not found"}) for v in "xxxyyyxxxyyy"]
    + [("ghost", {}, {"err": "Unknown tool: ghost"}) for _ in range(6)]
)


def test_locally_hashed_results_give_the_same_verdicts_and_state():
    """A gateway sending hash_result's wire fields instead of payloads (spec §7.5)."""

    def feed(local: bool) -> tuple[list[Any], RunState]:
        state, verdicts = None, []
        for seq, (tool, args, outcome) in enumerate(STORY_CALLS * 2):
            events = [call("r", 2 * seq, tool, args, call_id=f"c{seq}")]
            res, err = outcome.get("res", UNSET), outcome.get("err", UNSET)
            if local:
                fields = wire_fields(hashed(tool, args, res, err))
                events.append(result("r", 2 * seq + 1, tool, f"c{seq}", **fields))
            else:
                events.append(result("r", 2 * seq + 1, tool, f"c{seq}", result=res, error=err))
            for event in events:
                out = apply(state, event, low(unknownToolThreshold=4), NO_RECOVERY)
                state, verdicts = out.state, verdicts + out.verdicts
        return verdicts, state

    raw_verdicts, raw_state = feed(False)
    local_verdicts, local_state = feed(True)
    assert raw_verdicts == local_verdicts
    assert stored(raw_state) == stored(local_state)
    assert {v.detector for v in raw_verdicts} >= {"generic_repeat", "argument_churn", "unknown_tool_repeat"}


def test_wire_fields_are_only_those_set():
    assert wire_fields(hashed("read", {}, err="x")) == {
        "result_hash": hashed("read", {}, err="x").result_hash,
        "no_progress": True,
    }
    assert wire_fields(hashed("read", {}, VETO_RESULT)) == {"outcome_kind": "veto"}
    failed = wire_fields(hashed("exec", {}, exec_failure("boom")))
    assert failed["outcome_kind"] == "terminal_failure" and set(failed) == {
        "result_hash",
        "outcome_kind",
        "failure_identity",
    }


def test_argument_churn_switch_is_read_checked_and_merged():
    from schemas.configparse import ConfigError

    assert fleet().default.argument_churn is True
    assert fleet(detectors={"argumentChurn": False}).default.argument_churn is False
    with pytest.raises(ConfigError, match=r"^tools\.loopDetection\.detectors\.argumentChurn: expected true or false"):
        fleet(detectors={"argumentChurn": "no"})
    merged = fleet(agents={"a": {"detectors": {"argumentChurn": False}}}, detectors={"pingPong": False}).for_agent("a")
    assert (merged.argument_churn, merged.ping_pong, merged.generic_repeat) == (False, False, True)


CALL_MENU = [("exec", {"c": 1}), ("exec", {"c": 2}), ("read", {"p": 1}), ("ghost", {})]
OUTCOME_MENU = [
    {"res": text_result("same")},
    {"res": exec_failure("boom at 12:00:01")},
    {"err": "Unknown tool: ghost"},
    {"res": text_result("other")},
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=60))
def test_reporting_vetoes_or_not_leaves_the_same_run(steps):
    """Property (spec §7.1): a gateway that answers each block with its veto
    result and one that does not get the same verdicts and the same history."""
    config = low(unknownToolThreshold=4)
    quiet, reporting = Driver(config), Driver(config)
    for call_index, outcome_index in steps:
        tool, args = CALL_MENU[call_index]
        verdicts = [d.step(tool, args, **OUTCOME_MENU[outcome_index]) for d in (quiet, reporting)]
        assert msgspec.structs.replace(verdicts[0], seq=0) == msgspec.structs.replace(verdicts[1], seq=0)
        if verdicts[1].decision == "block":
            assert reporting.result(tool, result=VETO_RESULT) == []
    assert quiet.state().history == reporting.state().history
    assert quiet.state().unfinished == reporting.state().unfinished


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text("0123456789abcdef", min_size=16, max_size=16), min_size=2, max_size=2),
    st.text(st.characters(blacklist_characters='"\\<', blacklist_categories=["Cs"]), max_size=40),
)
def test_any_fresh_marker_id_hashes_the_same(ids, body):
    """Property: the same wrapped content under any two ids is one outcome."""
    first, second = (hashed("web_fetch", {}, text_result(f"fetched: {wrap(i, body)} done")) for i in ids)
    assert first.result_hash == second.result_hash
