"""Spec §3: what counts as "the same" (args hashes and result hashes)."""

from __future__ import annotations

import hashlib
import json

import pytest
from msgspec import UNSET

from builders import Driver, expected_args_hash, expected_error_hash, low, sha
from schemas.state import (
    VETO,
    KIND_COMMAND_STATUS,
    KIND_OTHER,
    KIND_PROCESS_LOG,
    KIND_PROCESS_POLL,
    KIND_VOLATILE_SEND,
)
from schemas.codec import decode_event
from streams.engine.hashing import (
    VETO_OUTCOME,
    ResultHashes,
    args_hash,
    classify,
    result_outcome,
    strip_volatile,
    unknown_tool_name,
)
from streams.engine.stablejson import decode_payload


def outcome(tool, args=UNSET, result=UNSET, error=UNSET):
    """The result hash the engine would record for this call and result."""
    return result_outcome(tool, classify(tool, args), result, error).result_hash


def pair(hashes: ResultHashes) -> tuple[str | None, str | None]:
    return hashes.result_hash, hashes.unknown_tool_name


# --- args_hash -------------------------------------------------------------------


def test_args_hash_is_tool_colon_sha256_of_stable_json():
    args = {"path": "/tmp/ż", "n": 3, "flags": ["a", "b"], "opt": {"y": True, "x": None}}
    assert args_hash("read", args) == expected_args_hash("read", args)
    assert (
        args_hash("read", args)
        == "read:"
        + hashlib.sha256(b'{"flags":["a","b"],"n":3,"opt":{"x":null,"y":true},"path":"/tmp/\xc5\xbc"}').hexdigest()
    )


def test_args_hash_ignores_key_order_at_any_depth():
    one = {"a": 1, "b": {"c": 2, "d": [{"e": 1, "f": 2}]}}
    two = {"b": {"d": [{"f": 2, "e": 1}], "c": 2}, "a": 1}
    assert args_hash("t", one) == args_hash("t", two)


def test_args_hash_differs_by_tool_and_by_value():
    assert args_hash("t", {"a": 1}) != args_hash("u", {"a": 1})
    assert args_hash("t", {"a": 1}) != args_hash("t", {"a": 2})
    assert args_hash("t", [1, 2]) != args_hash("t", [2, 1])


def test_absent_args_hash_as_js_undefined():
    assert args_hash("t", UNSET) == "t:" + hashlib.sha256(b"undefined").hexdigest()
    assert args_hash("t", None) == "t:" + hashlib.sha256(b"null").hexdigest()


def test_args_hash_js_numbers_on_the_wire():
    one = decode_event(
        b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","args":{"n":1.0,"e":1e-7}}'
    )
    two = decode_event(
        b'{"type":"tool_call","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","args":{"e":0.0000001,"n":1}}'
    )
    expected = "t:" + hashlib.sha256(b'{"e":1e-7,"n":1}').hexdigest()
    assert args_hash("t", one.args) == expected
    assert args_hash("t", two.args) == expected


# --- update_plan ---------------------------------------------------------------------


def plan(*steps, explanation=UNSET):
    value = {"plan": [{"step": text, "status": status} for text, status in steps]}
    if explanation is not UNSET:
        value["explanation"] = explanation
    return value


def test_update_plan_rewording_is_not_progress():
    one = plan(("write the parser", "completed"), ("test it", "in_progress"), explanation="because")
    two = plan(("Write parser!", "completed"), ("run the tests", "in_progress"), explanation="other words")
    assert args_hash("update_plan", one) == args_hash("update_plan", two)


@pytest.mark.parametrize(
    "changed",
    [
        plan(("a", "completed"), ("b", "completed")),  # a status changed
        plan(("a", "completed"), ("b", "pending"), ("c", "pending")),  # plan length
        plan(("a", "completed"), ("", "pending")),  # a step lost its text
        plan(("a", "completed"), ("b", "pending"), explanation="now explained"),  # explanation present
    ],
)
def test_update_plan_shape_changes_are_progress(changed):
    base = plan(("a", "completed"), ("b", "pending"))
    assert args_hash("update_plan", base) != args_hash("update_plan", changed)


def test_update_plan_shape_only_applies_to_update_plan():
    one = plan(("a", "completed"))
    two = plan(("b", "completed"))
    assert args_hash("other_tool", one) != args_hash("other_tool", two)
    assert args_hash("other_tool", one) == expected_args_hash("other_tool", one)


def test_update_plan_result_details_reduced_to_shape_and_text_ignored():
    one = {"details": plan(("x", "completed"), ("y", "pending")), "content": [{"type": "text", "text": "Plan updated"}]}
    two = {"details": plan(("reworded", "completed"), ("z", "pending")), "content": [{"type": "text", "text": "other"}]}
    three = {
        "details": plan(("x", "completed"), ("y", "completed")),
        "content": [{"type": "text", "text": "Plan updated"}],
    }
    assert outcome("update_plan", {}, one) == outcome("update_plan", {}, two)
    assert outcome("update_plan", {}, one) != outcome("update_plan", {}, three)


# --- errors and unknown tools ---------------------------------------------------------


def test_error_hash_is_error_prefix_and_sha256_of_quoted_message():
    assert pair(result_outcome("t", KIND_OTHER, UNSET, "boom")) == (expected_error_hash("boom"), None)
    assert pair(result_outcome("t", KIND_OTHER, UNSET, "błąd: zły plik")) == (
        "error:" + hashlib.sha256('"błąd: zły plik"'.encode()).hexdigest(),
        None,
    )


def test_error_takes_precedence_over_result():
    with_result = result_outcome("t", KIND_OTHER, {"details": {"a": 1}}, "boom")
    assert pair(with_result) == (expected_error_hash("boom"), None)


def test_null_error_means_no_error():
    res = {"details": {"a": "b"}, "content": [{"type": "text", "text": "ok"}]}
    assert result_outcome("t", KIND_OTHER, res, None) == result_outcome("t", KIND_OTHER, res, UNSET)
    assert result_outcome("t", KIND_OTHER, res, None).result_hash == sha({"details": {"a": "b"}, "text": "ok"})


def test_nothing_at_all_has_no_result_hash():
    assert result_outcome("t", KIND_OTHER, UNSET, UNSET) == ResultHashes()
    assert result_outcome("t", KIND_OTHER, UNSET, None) == ResultHashes()


@pytest.mark.parametrize(
    ("message", "name"),
    [
        ("Unknown tool: Browser_Open", "browser_open"),
        ("unknown tool web-search", "web-search"),
        ("UNKNOWN TOOL: 'FetchURL'", "fetchurl"),
        ('Error: unknown tool:"Foo2"', "foo2"),
        ("Unknown Tool:   bar", "bar"),
        ('Tool "WebSearch" not found', "websearch"),
        ("tool 'Bar' is not available", "bar"),
        ("TOOL baz NOT FOUND", "baz"),
        ("the tool Qux Is Not Available here", "qux"),
    ],
)
def test_unknown_tool_name_extracted_lower_cased(message, name):
    assert unknown_tool_name(message) == name
    hashed, unknown = pair(result_outcome("t", KIND_OTHER, UNSET, message))
    assert hashed == expected_error_hash(message)
    assert unknown == name


@pytest.mark.parametrize(
    "message", ["file not found", "permission denied", "tool not found", "", "   ", "no such tool here"]
)
def test_errors_that_name_no_tool(message):
    assert unknown_tool_name(message) is None
    assert result_outcome("t", KIND_OTHER, UNSET, message).unknown_tool_name is None


@pytest.mark.parametrize(
    ("message", "name"),
    [
        ("Un\u212anown tool: foo", None),  # the Kelvin sign is not "k" to the reference's /i
        ("Tool foo i\u017f not available", None),  # nor is the long s an "s"
        ("tool foo \u0131s not available", None),  # nor the dotless i an "i"
        ("unknown tool\x1cfoo", None),  # \x1c-\x1f and \x85 are not JavaScript whitespace
        ("unknown tool\x85foo", None),
        ("unknown tool\ufefffoo", "foo"),  # but the byte-order mark is
        ("tool\u3000foo\u00a0not found", "foo"),
        ("tool " + "a" * 300 + " not found", "a" * 300),  # no length limit on the name
    ],
)
def test_unknown_tool_matching_is_javascripts(message, name):
    """The reference's patterns are JavaScript regular expressions with /i and
    no /u: ASCII case folding, JavaScript's whitespace."""
    assert unknown_tool_name(message) == name


def test_a_name_beyond_the_id_bound_is_kept_as_its_digest():
    """Records keep the name, so one longer than any id is kept as its sha256:
    still equal for equal names and different for different ones."""
    name = "b" * 5000
    assert unknown_tool_name("unknown tool: " + name) == "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    assert unknown_tool_name("unknown tool: " + name + "c") != unknown_tool_name("unknown tool: " + name)


def test_non_finite_number_error_is_hashed_as_its_javascript_text():
    """`"error": 1e400` parses to Infinity; the reference hashes `${error}`, the text Infinity."""
    event = decode_event(
        b'{"type":"tool_result","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","error":1e400}'
    )
    assert result_outcome("t", KIND_OTHER, UNSET, event.error).result_hash == expected_error_hash("Infinity")
    event = decode_event(b'{"type":"tool_result","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","error":1.50}')
    assert result_outcome("t", KIND_OTHER, UNSET, event.error).result_hash == expected_error_hash("1.5")


def test_unknown_tool_only_from_errors_not_results():
    res = {"content": [{"type": "text", "text": "Unknown tool: foo"}]}
    assert result_outcome("t", KIND_OTHER, res, UNSET).unknown_tool_name is None


# --- the guard's own veto ---------------------------------------------------------------


@pytest.mark.parametrize("tool", ["exec", "read", "process", "message", "sessions_send"])
def test_veto_result_has_no_hash_and_is_a_veto(tool):
    veto = {
        "details": {"status": "blocked", "deniedReason": "tool-loop"},
        "content": [{"type": "text", "text": "blocked: loop"}],
    }
    args = {"action": "poll"} if tool == "process" else {"action": "send"}
    assert result_outcome(tool, classify(tool, args), veto, UNSET) == VETO_OUTCOME
    assert VETO_OUTCOME.result_hash is None and VETO_OUTCOME.outcome_kind == "veto"


def test_other_blocked_results_do_hash():
    res = {"details": {"status": "blocked", "deniedReason": "policy"}}
    assert outcome("read", {}, res) == sha({"details": {"status": "blocked", "deniedReason": "policy"}, "text": ""})


# --- exec ---------------------------------------------------------------------------------


def exec_result(details, text=""):
    return {"details": details, "content": [{"type": "text", "text": text}]}


META_A = {"durationMs": 12, "pid": 101, "sessionId": "s-1", "cwd": "/a", "startedAt": 1}
META_B = {"durationMs": 9999, "pid": 202, "sessionId": "s-2", "cwd": "/b", "startedAt": 2}


def test_exec_running_hashes_status_and_tail_only():
    one = exec_result({"status": "running", "tail": "building...", **META_A}, "text one")
    two = exec_result({"status": "running", "tail": "building...", **META_B}, "text two")
    three = exec_result({"status": "running", "tail": "linking...", **META_A}, "text one")
    assert outcome("exec", {"command": "make"}, one) == outcome("exec", {"command": "make"}, two)
    assert outcome("exec", {"command": "make"}, one) != outcome("exec", {"command": "make"}, three)


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_exec_finished_ignores_metadata(status):
    one = exec_result({"status": status, "exitCode": 1, "timedOut": False, "aggregated": "out", **META_A})
    two = exec_result({"status": status, "exitCode": 1, "timedOut": False, "aggregated": "out", **META_B})
    assert outcome("exec", {}, one) == outcome("exec", {}, two)


@pytest.mark.parametrize("change", [{"exitCode": 2}, {"timedOut": True}, {"aggregated": "other"}, {"status": "failed"}])
def test_exec_finished_outcome_fields_count(change):
    base = {"status": "completed", "exitCode": 1, "timedOut": False, "aggregated": "out"}
    assert outcome("exec", {}, exec_result(base)) != outcome("exec", {}, exec_result({**base, **change}))


def test_exec_output_is_trimmed_aggregated_else_result_text():
    base = {"status": "completed", "exitCode": 0, "timedOut": False}
    trimmed = outcome("exec", {}, exec_result({**base, "aggregated": "  out\n"}, "ignored text"))
    plain = outcome("exec", {}, exec_result({**base, "aggregated": "out"}, "other ignored text"))
    from_text = outcome("exec", {}, exec_result({**base, "aggregated": "  \n "}, "  out "))
    no_aggregated = outcome("exec", {}, exec_result(base, "out"))
    assert trimmed == plain == from_text == no_aggregated
    assert outcome("exec", {}, exec_result(base, "different")) != plain


@pytest.mark.parametrize("status", ["approval-pending", "approval-unavailable"])
def test_exec_approval_hashes_status_reason_host_command_warning(status):
    base = {
        "status": status,
        "reason": "needs approval",
        "host": "gw1",
        "command": "rm -rf x",
        "warningText": "careful",
    }
    one = outcome("exec", {}, exec_result({**base, **META_A}))
    assert one == outcome("exec", {}, exec_result({**base, **META_B}))
    for key, value in [("reason", "other"), ("host", "gw2"), ("command", "ls"), ("warningText", "w")]:
        assert outcome("exec", {}, exec_result({**base, key: value, **META_A})) != one, key
    other_status = "approval-unavailable" if status == "approval-pending" else "approval-pending"
    assert outcome("exec", {}, exec_result({**base, "status": other_status})) != one


# --- process poll / log ------------------------------------------------------------------


def test_classification_of_polls_and_sends():
    assert classify("command_status", UNSET) == KIND_COMMAND_STATUS
    assert classify("process", {"action": "poll"}) == KIND_PROCESS_POLL
    assert classify("process", {"action": "log"}) == KIND_PROCESS_LOG
    assert classify("process", {"action": "kill"}) == KIND_OTHER
    assert classify("sessions_send", {}) == KIND_VOLATILE_SEND
    for action in [
        "send",
        "broadcast",
        "reply",
        "thread-reply",
        "sendWithEffect",
        "sendAttachment",
        "upload-file",
        "sticker",
        "poll",
    ]:
        assert classify("message", {"action": action}) == KIND_VOLATILE_SEND, action
    assert classify("message", {"action": "read"}) == KIND_OTHER
    assert classify("exec", {"action": "poll"}) == KIND_OTHER


POLL_BASE = {"status": "running", "exitCode": None, "exitSignal": None, "aggregated": "tick"}


def test_process_poll_hashes_listed_fields_and_text():
    args = {"action": "poll", "sessionId": "s1"}
    base = outcome("process", args, exec_result({**POLL_BASE, **META_A}, "t"))
    assert base == outcome("process", args, exec_result({**POLL_BASE, **META_B}, "t"))
    for key, value in [("status", "exited"), ("exitCode", 0), ("exitSignal", "SIGTERM"), ("aggregated", "tock")]:
        assert outcome("process", args, exec_result({**POLL_BASE, key: value}, "t")) != base, key
    assert outcome("process", args, exec_result(POLL_BASE, "other text")) != base


LOG_BASE = {
    "status": "running",
    "totalLines": 10,
    "totalChars": 200,
    "truncated": False,
    "exitCode": None,
    "exitSignal": None,
}


def test_process_log_hashes_listed_fields_and_text():
    args = {"action": "log", "sessionId": "s1"}
    base = outcome("process", args, exec_result({**LOG_BASE, **META_A}, "t"))
    assert base == outcome("process", args, exec_result({**LOG_BASE, **META_B, "aggregated": "not a log field"}, "t"))
    changes = [
        ("status", "exited"),
        ("totalLines", 11),
        ("totalChars", 201),
        ("truncated", True),
        ("exitCode", 1),
        ("exitSignal", "SIGKILL"),
    ]
    for key, value in changes:
        assert outcome("process", args, exec_result({**LOG_BASE, key: value}, "t")) != base, key
    assert outcome("process", args, exec_result(LOG_BASE, "other text")) != base


# --- sending tools -----------------------------------------------------------------------------

VOLATILE = {
    "messageId": "m1",
    "message_id": "m1",
    "messageIds": ["m1"],
    "platformMessageId": "p1",
    "platformMessageIds": ["p1"],
    "fileId": "f1",
    "file_id": "f1",
    "fileKey": "k1",
    "pollId": "q1",
    "poll_id": "q1",
    "receipt": {"r": 1},
    "runId": "run1",
    "idempotencyKey": "i1",
    "ts": 1,
    "timestamp": 2,
    "sentAt": "t",
    "deliveredAt": "t",
    "createdAt": "t",
}


def send(details, text="sent"):
    return {"details": details, "content": [{"type": "text", "text": text}]}


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("sessions_send", {"sessionKey": "x", "message": "hi"}),
        ("message", {"action": "send", "to": "u"}),
        ("message", {"action": "thread-reply"}),
        ("message", {"action": "poll"}),
    ],
)
def test_sending_tools_hash_details_without_volatile_fields(tool, args):
    stable = {"status": "ok", "channel": "c1"}
    hashed = outcome(tool, args, send({**stable, **VOLATILE}))
    assert hashed == sha(stable)
    assert hashed == outcome(tool, args, send({**stable, **{k: "new" for k in VOLATILE}}, "other text"))


def test_volatile_fields_removed_at_any_depth():
    args = {"action": "broadcast"}
    one = {"results": [{"target": "a", "messageId": "m1", "meta": {"sentAt": 1, "ok": True}}], "ok": True}
    two = {"results": [{"target": "a", "messageId": "m2", "meta": {"sentAt": 2, "ok": True}}], "ok": True}
    assert outcome("message", args, send(one)) == outcome("message", args, send(two))
    assert outcome("message", args, send(one)) == sha({"ok": True, "results": [{"meta": {"ok": True}, "target": "a"}]})
    changed = {"results": [{"target": "b", "messageId": "m1", "meta": {"sentAt": 1, "ok": True}}], "ok": True}
    assert outcome("message", args, send(one)) != outcome("message", args, send(changed))


@pytest.mark.parametrize(
    "marker",
    [{"direction": "outbound"}, {"senderId": "u1"}, {"accountId": "a1"}, {"conversation": {"id": "conv1"}}],
)
def test_message_object_id_is_dropped(marker):
    args = {"action": "reply"}
    one = {"message": {"id": "msg-1", "text": "hello", **marker}}
    two = {"message": {"id": "msg-2", "text": "hello", **marker}}
    assert outcome("message", args, send(one)) == outcome("message", args, send(two))
    assert outcome("message", args, send(one)) == sha({"message": {"text": "hello", **marker}})
    other_text = {"message": {"id": "msg-1", "text": "bye", **marker}}
    assert outcome("message", args, send(one)) != outcome("message", args, send(other_text))


def test_id_of_non_message_object_is_kept():
    args = {"action": "send"}
    # no text: not a message object
    one = {"attachment": {"id": "a1", "direction": "outbound"}}
    two = {"attachment": {"id": "a2", "direction": "outbound"}}
    assert outcome("message", args, send(one)) != outcome("message", args, send(two))
    # text but no direction/sender/account/conversation
    one = {"item": {"id": "a1", "text": "x"}}
    two = {"item": {"id": "a2", "text": "x"}}
    assert outcome("message", args, send(one)) != outcome("message", args, send(two))
    assert strip_volatile({"item": {"id": "a1", "text": "x"}}) == {"item": {"id": "a1", "text": "x"}}


def test_message_action_not_sending_keeps_ids():
    args = {"action": "read"}
    one = send({"messageId": "m1"}, "t")
    two = send({"messageId": "m2"}, "t")
    assert outcome("message", args, one) != outcome("message", args, two)
    assert outcome("message", args, one) == sha({"details": {"messageId": "m1"}, "text": "t"})


# --- everything else -----------------------------------------------------------------------------


def test_generic_result_is_hash_of_details_and_joined_text():
    res = {
        "details": {"path": "/x", "size": 3},
        "content": [
            {"type": "text", "text": "  first"},
            {"type": "image", "data": "AAAA"},
            {"text": "no type: skipped"},
            {"type": 7, "text": "type not a string: skipped"},
            {"type": "text", "text": "second  \n"},
            {"type": "text"},
        ],
    }
    assert outcome("read", {"path": "/x"}, res) == sha({"details": {"path": "/x", "size": 3}, "text": "first\nsecond"})


def test_generic_result_details_and_text_both_count():
    base = {"details": {"a": 1}, "content": [{"type": "text", "text": "t"}]}
    assert outcome("read", {}, base) != outcome("read", {}, {**base, "details": {"a": 2}})
    assert outcome("read", {}, base) != outcome("read", {}, {**base, "content": [{"type": "text", "text": "u"}]})
    reordered = {"content": [{"type": "text", "text": "t"}], "details": {"a": 1}}
    assert outcome("read", {}, base) == outcome("read", {}, reordered)


@pytest.mark.parametrize(("tool", "args"), [("read", {}), ("sessions_send", {"message": "hi"})])
def test_non_object_details_hash_as_empty_details(tool, args):
    """As in the reference gateway, `details` that are not an object count as `{}`:
    only the text can then tell two results apart."""
    one = {"details": "queued", "content": [{"type": "text", "text": "t"}]}
    two = {"details": "rejected", "content": [{"type": "text", "text": "t"}]}
    empty = {"details": {}, "content": [{"type": "text", "text": "t"}]}
    assert outcome(tool, args, one) == outcome(tool, args, two) == outcome(tool, args, empty)


def test_generic_result_js_numbers():
    one = decode_payload(b'{"details":{"n":2.0,"x":1e-7},"content":[]}')
    assert outcome("read", {}, one) == hashlib.sha256(b'{"details":{"n":2,"x":1e-7},"text":""}').hexdigest()


# --- precomputed hashes (through the engine) ---------------------------------------------------------


def test_precomputed_args_hash_takes_precedence():
    d = Driver(low())
    d.call("read", {"path": "/x"}, args_hash="read:precomputed")
    assert d.state().history[-1].args_hash == "read:precomputed"


def test_precomputed_result_hash_takes_precedence():
    d = Driver(low())
    d.call("read", {"path": "/x"})
    d.result("read", result={"details": {"a": 1}}, result_hash="R-given")
    assert d.state().history[-1].result_hash == "R-given"


def test_precomputed_result_hash_with_error_still_names_unknown_tool():
    d = Driver(low())
    d.call("brwser", {})
    d.result("brwser", error="Unknown tool: Brwser", result_hash="R-given")
    assert d.state().history[-1].result_hash == "R-given"
    assert d.state().history[-1].unknown_tool == "brwser"


def test_precomputed_unknown_tool_name_is_used():
    d = Driver(low())
    d.call("x", {})
    d.result("x", result_hash="R", unknown_tool_name="gone")
    assert d.state().history[-1].unknown_tool == "gone"


def test_engine_records_spec_hashes():
    d = Driver(low())
    d.call("read", {"path": "/ż", "n": 1})
    d.result("read", result={"details": {"ok": True}, "content": [{"type": "text", "text": " hi "}]})
    record = d.state().history[-1]
    assert record.args_hash == expected_args_hash("read", {"path": "/ż", "n": 1})
    assert record.result_hash == sha({"details": {"ok": True}, "text": "hi"})
    d.call("read", {"path": "/q"})
    d.result("read", error="Tool 'Zap' not found")
    record = d.state().history[-1]
    assert record.result_hash == "error:" + hashlib.sha256(json.dumps("Tool 'Zap' not found").encode()).hexdigest()
    assert record.unknown_tool == "zap"


def test_engine_veto_result_for_an_allowed_call_makes_it_a_veto_record():
    """Another guard vetoed a call this engine allowed (spec §7.1): the open
    record is completed as a veto, with no result hash."""
    d = Driver(low())
    d.call("read", {"path": "/x"})
    verdicts = d.result("read", result={"details": {"status": "blocked", "deniedReason": "tool-loop"}})
    assert verdicts == []
    (record,) = d.state().history
    assert record.result_hash is None and record.flags == VETO
