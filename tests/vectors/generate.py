"""Golden vectors for local hashing, computed by the Python engine.

`python -m tests.vectors.generate` writes tests/vectors/hashing.json. Each case
gives a call's args (and, for a finished call, its result or error) as the JSON
text a JavaScript gateway puts on the wire, and under `expected` every field a
locally hashing client publishes for it, computed by the Python client's own
path (`streams.client.local_call_fields` / `local_outcome_fields`, which call
the engine's hashing). Fields the client leaves out are listed as null, so
both test suites compare every field the file lists:

- tests/engine/test_vectors.py checks the file equals a fresh generation;
- clients/openclaw/test/hashing.test.ts checks the OpenClaw plugin's hashing.

The outcome fields listed are those of the `tool_result` event schema, so a
field the schema gains is listed (and checked) from the next generation on.
`spec` names the rule each case pins (§3, or the §7.1 rules).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from msgspec import UNSET

from schemas.events import ToolResult
from streams.client import local_call_fields, local_outcome_fields
from schemas.codec import drop_lone_surrogates
from streams.engine.hashing import classify
from streams.engine.stablejson import decode_payload

OUT = Path(__file__).with_name("hashing.json")

CALL_FIELDS = ("args_hash", "args")
_NOT_OUTCOME = {
    "type",
    "run_id",
    "seq",
    "tool_call_id",
    "tool_name",
    "args",
    "args_hash",
    "result",
    "error",
    "ts",
    "reply_partition",
}
OUTCOME_FIELDS = tuple(name for name in ToolResult.__struct_fields__ if name not in _NOT_OUTCOME)


def wire(text: str) -> Any:
    """The value the engine decodes from this JSON text inside an event."""
    return decode_payload(drop_lone_surrogates(text.encode("utf-8")))


def text_result(text: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool result as OpenClaw shapes one."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if details is not None:
        result["details"] = details
    return result


def wrap(content: str, marker_id: str, slashes: str = "", end_id: str | None = None) -> str:
    """External content as the gateway wraps it, with `slashes` before each quote around an id."""
    q = slashes + '"'
    return (
        f"<<<EXTERNAL_UNTRUSTED_CONTENT id={q}{marker_id}{q}>>>{content}"
        f"<<<END_EXTERNAL_UNTRUSTED_CONTENT id={q}{end_id or marker_id}{q}>>>"
    )


# One call's events: (name, spec rule, tool, args, result-or-None, error-or-None).
# args and result are Python values dumped as JSON, or str when the exact JSON text matters; error is the message.
EXEC_FAIL = (
    "Traceback: ConnectionError at 2026-09-01T12:00:03.25Z (pid 4411, attempt 2) after 1.5s; retry #3 at 12:00:04"
)


def _exec(status: str, **details: Any) -> dict[str, Any]:
    return {"status": status, **details}


CASES: list[tuple[str, str, str, Any, Any, Any]] = [
    # -- stable JSON --------------------------------------------------------------
    (
        "unicode",
        "3",
        "read",
        {"path": "/tmp/zażółć.txt", "emoji": "😀 ✓", "cjk": "日本語", "nul": "a\u0000b\u001f\u007f"},
        None,
        None,
    ),
    ("unicode key order is by UTF-16 code units", "3", "read", {"\ue000": 1, "😀": 2, "z": 3, "é": 4}, None, None),
    (
        "line and paragraph separators",
        "3",
        "read",
        {"s": "a\u2028b\u2029c", "q": '"quoted" \\ back\\slash\t/'},
        None,
        None,
    ),
    (
        "lone surrogates are dropped",
        "3",
        "read",
        '{"cut": "emoji \\ud83d", "low": "\\ude00 x", "pair": "\\ud83d\\ude00"}',
        None,
        None,
    ),
    (
        "floats",
        "3",
        "calc",
        '{"a": 1.0, "b": -0.0, "c": 0.30000000000000004, "d": 1e21, "e": 1e-7, "f": 123456789012345680000.0, "g": 5e-324, "h": 1.7976931348623157e308, "i": 0.000001, "j": 1E+2, "k": 2.50}',
        None,
        None,
    ),
    ("0.1 + 0.2 as sent by JavaScript", "3", "calc", {"sum": 0.1 + 0.2, "third": 1 / 3}, None, None),
    (
        "big integers",
        "3",
        "calc",
        '{"big": 12345678901234567890, "edge": 9007199254740993, "safe": 9007199254740991, "neg": -18446744073709551616, "huge": 1'
        + "0" * 30
        + "}",
        None,
        None,
    ),
    ("nested objects", "3", "edit", {"z": {"y": {"x": [1, {"b": 2, "a": [None, True, False]}]}}, "a": []}, None, None),
    ("key order does not matter", "3", "edit", '{"b": {"d": 1, "c": 2}, "a": 0}', None, None),
    ("key order does not matter (same args reordered)", "3", "edit", '{"a": 0, "b": {"c": 2, "d": 1}}', None, None),
    ("no args", "3", "status", None, None, None),
    (
        "update_plan args reduced to shape",
        "3",
        "update_plan",
        {
            "plan": [{"step": "write tests", "status": "in_progress"}, {"step": " ", "status": "pending"}, "odd"],
            "explanation": "why",
        },
        None,
        None,
    ),
    # -- result rules of §3 ---------------------------------------------------------
    ("error", "3", "read", {"path": "/nope"}, None, "ENOENT: no such file or directory, open '/nope'"),
    ("unknown tool: pattern 1", "3", "frobnicate", {}, None, "Unknown tool: Frobnicate.V2"),
    ("unknown tool: pattern 2", "3", "frobnicate", {}, None, "Tool 'Frob_nicate' not found"),
    ("unknown tool: pattern 2, not available", "3", "frobnicate", {}, None, "tool frob is not available"),
    ("unknown tool: Kelvin sign is not k", "3", "frobnicate", {}, None, "Unknown tool: \u212aelvin"),
    (
        "loop-guard veto has no hash",
        "3",
        "exec",
        {"command": "make"},
        text_result(
            "CRITICAL: blocked", {"status": "blocked", "deniedReason": "tool-loop", "reason": "CRITICAL: blocked"}
        ),
        None,
    ),
    (
        "another guard's veto is hashed",
        "3",
        "exec",
        {"command": "make"},
        text_result("denied", {"status": "blocked", "deniedReason": "approval"}),
        None,
    ),
    (
        "exec running",
        "3",
        "exec",
        {"command": "sleep 9"},
        text_result("started", _exec("running", tail="tick\n", pid=77, sessionId="s1", durationMs=12)),
        None,
    ),
    (
        "exec completed uses aggregated",
        "3",
        "exec",
        {"command": "ls"},
        text_result("a\nb", _exec("completed", exitCode=0, aggregated="  a\nb  ", durationMs=5, pid=8, cwd="/w")),
        None,
    ),
    (
        "exec failed falls back to text",
        "3",
        "exec",
        {"command": "false"},
        text_result("(Command exited with code 1)", _exec("failed", exitCode=1, aggregated="   ", durationMs=3)),
        None,
    ),
    (
        "exec timed out",
        "3",
        "exec",
        {"command": "sleep 99"},
        text_result("timeout", _exec("failed", exitCode=None, timedOut=True)),
        None,
    ),
    (
        "exec approval pending",
        "3",
        "exec",
        {"command": "rm -rf /tmp/x"},
        text_result(
            "needs approval",
            _exec(
                "approval-pending",
                reason="dangerous",
                host="gw",
                command="rm -rf /tmp/x",
                warningText="careful",
                approvalId="a-1",
            ),
        ),
        None,
    ),
    (
        "exec approval unavailable, fields missing",
        "3",
        "exec",
        {"command": "x"},
        text_result("no approver", _exec("approval-unavailable")),
        None,
    ),
    ("exec without status is generic", "3", "exec", {"command": "x"}, text_result("ok", {"exitCode": 0}), None),
    (
        "process poll",
        "3",
        "process",
        {"action": "poll", "sessionId": "s1"},
        text_result(
            "still running", {"status": "running", "exitCode": None, "aggregated": "step 3/9", "durationMs": 400}
        ),
        None,
    ),
    ("process poll, status missing", "3", "process", {"action": "poll", "sessionId": "s1"}, text_result("?", {}), None),
    (
        "process log",
        "3",
        "process",
        {"action": "log", "sessionId": "s1", "offset": 0},
        text_result(
            "line 1\nline 2",
            {
                "status": "completed",
                "totalLines": 2,
                "totalChars": 13,
                "truncated": False,
                "exitCode": 0,
                "exitSignal": None,
                "pid": 5,
            },
        ),
        None,
    ),
    (
        "process kill is generic",
        "3",
        "process",
        {"action": "kill", "sessionId": "s1"},
        text_result("killed", {"status": "killed"}),
        None,
    ),
    ("command_status", "3", "command_status", {"id": "c1"}, text_result("running", {"status": "running"}), None),
    (
        "sessions_send drops volatile ids",
        "3",
        "sessions_send",
        {"sessionKey": "agent:x:main", "message": "hi"},
        text_result(
            "sent",
            {"status": "ok", "runId": "r-9", "messageId": "m-1", "delivery": {"ts": 5, "sentAt": "now", "id": "keep"}},
        ),
        None,
    ),
    (
        "message send drops a message object's id",
        "3",
        "message",
        {"action": "send", "to": "#ops", "text": "deploy done"},
        text_result(
            "ok",
            {
                "ok": True,
                "message": {"id": "m-77", "text": "deploy done", "direction": "outbound", "createdAt": 1},
                "receipt": {"x": 1},
                "items": [{"platformMessageIds": ["a"], "fileId": "f"}],
            },
        ),
        None,
    ),
    (
        "message read is generic",
        "3",
        "message",
        {"action": "read", "channel": "#ops"},
        text_result("3 messages", {"messages": [{"id": "m1", "text": "a", "direction": "inbound"}]}),
        None,
    ),
    (
        "update_plan result ignores wording and text",
        "3",
        "update_plan",
        {"plan": [{"step": "a", "status": "completed"}]},
        text_result("Plan updated", {"plan": [{"step": "reworded", "status": "completed"}], "explanation": ""}),
        None,
    ),
    (
        "generic result joins text parts",
        "3",
        "read",
        {"path": "/a"},
        {
            "content": [
                {"type": "text", "text": " one "},
                {"type": "image", "data": "xx"},
                {"text": "no type"},
                {"type": "text", "text": "two\n"},
            ],
            "details": {"bytes": 8},
        },
        None,
    ),
    ("generic result without details", "3", "read", {"path": "/a"}, {"content": [{"type": "text", "text": "x"}]}, None),
    ("result that is not an object", "3", "calc", {"x": 1}, [1, "two", None], None),
    ("result null", "3", "calc", {"x": 1}, "null", None),
    (
        "result with floats and big integers",
        "3",
        "calc",
        {"x": 1},
        '{"content": [], "details": {"v": 1.50, "w": 1e21, "n": 12345678901234567890}}',
        None,
    ),
    # -- §7.1 ----------------------------------------------------------------------
    (
        "terminal exec failure",
        "7.1-exec",
        "exec",
        {"command": "pytest"},
        text_result("x", _exec("failed", exitCode=2, aggregated=EXEC_FAIL, durationMs=1500, pid=4411)),
        None,
    ),
    (
        "terminal exec failure, other times/pids/durations",
        "7.1-exec",
        "exec",
        {"command": "pytest -x"},
        text_result(
            "x",
            _exec(
                "failed",
                exitCode=2,
                aggregated=EXEC_FAIL.replace("12:00:03.25Z", "13:14:15+02:00")
                .replace("4411", "9")
                .replace("attempt 2", "ATTEMPT 5")
                .replace("1.5s", "20 ms")
                .replace("#3", "= 4")
                .replace("12:00:04", "9:59:59.123"),
                durationMs=20,
                pid=9,
            ),
        ),
        None,
    ),
    (
        "exec nonzero exit with only the exit text is not terminal",
        "7.1-exec",
        "exec",
        {"command": "false"},
        text_result("(Command exited with code 3)", _exec("completed", exitCode=3)),
        None,
    ),
    (
        "exec nonzero exit but timed out is not terminal",
        "7.1-exec",
        "exec",
        {"command": "sleep"},
        text_result("slow", _exec("failed", exitCode=137, timedOut=True, aggregated="killed")),
        None,
    ),
    (
        "exec exit 0 is not a failure",
        "7.1-exec",
        "exec",
        {"command": "true"},
        text_result("ok", _exec("completed", exitCode=0, aggregated="ok")),
        None,
    ),
    (
        "write unchanged",
        "7.1-write",
        "write",
        {"path": "/a", "content": "x"},
        text_result("No changes to /a", {"changed": False, "path": "/a"}),
        None,
    ),
    (
        "write changed is generic",
        "3",
        "write",
        {"path": "/a", "content": "y"},
        text_result("Wrote /a", {"changed": True, "path": "/a"}),
        None,
    ),
    (
        "untrusted content markers",
        "7.1-markers",
        "web_fetch",
        {"url": "https://example.com"},
        text_result(wrap("Hello", "0123456789abcdef"), {"source": wrap("Hello", "0123456789abcdef")}),
        None,
    ),
    (
        "untrusted content markers, fresh ids",
        "7.1-markers",
        "web_fetch",
        {"url": "https://example.com"},
        text_result(wrap("Hello", "a1b2c3d4e5f60718"), {"source": wrap("Hello", "a1b2c3d4e5f60718")}),
        None,
    ),
    (
        "untrusted content markers, JSON-escaped",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        text_result(json.dumps({"page": wrap('say \\"hi\\"', "00112233445566ff", "\\")})),
        None,
    ),
    (
        "untrusted content markers, inconsistent escaping kept",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        text_result(wrap('say "hi"', "00112233445566ff", "\\")),
        None,
    ),
    (
        "untrusted content markers, two backslashes kept",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        text_result(wrap("x", "00112233445566ff", "\\\\")),
        None,
    ),
    (
        "untrusted content markers, different ids kept",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        text_result(wrap("x", "00112233445566ff", end_id="ffeeddccbbaa9988")),
        None,
    ),
    (
        "untrusted content markers in a key",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        {"content": [], "details": {wrap("k", "0123456789abcdef"): 1}},
        None,
    ),
    (
        "untrusted content marker in an error",
        "7.1-markers",
        "web_fetch",
        {"url": "u"},
        None,
        "fetch failed: " + wrap("503", "0123456789abcdef"),
    ),
]


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _case(name: str, spec: str, tool: str, args: Any, result: Any, error: Any) -> dict[str, Any]:
    case: dict[str, Any] = {"name": name, "spec": spec, "tool": tool}
    norm_args = UNSET
    if args is not None:
        case["args"] = _json_text(args)
        norm_args = wire(case["args"])
    expected: dict[str, Any] = {field: None for field in CALL_FIELDS}
    expected.update(local_call_fields(tool, norm_args))
    if result is not None or error is not None:
        if result is not None:
            case["result"] = _json_text(result)
        if error is not None:
            case["error"] = json.dumps(error, ensure_ascii=False)
        outcome = local_outcome_fields(
            tool,
            classify(tool, norm_args),
            wire(case["result"]) if result is not None else UNSET,
            wire(case["error"]) if error is not None else UNSET,
        )
        expected.update({field: None for field in OUTCOME_FIELDS})
        expected.update(outcome)
    case["expected"] = expected
    return case


def generate() -> dict[str, Any]:
    return {
        "about": "Generated by `python -m tests.vectors.generate` from the Python engine; do not edit. "
        "Payloads are JSON texts as a gateway sends them; `expected` lists every field a locally "
        "hashing client publishes (null: not published); `spec` names the rule a case pins.",
        "cases": [_case(*case) for case in CASES],
    }


def render() -> str:
    return json.dumps(generate(), ensure_ascii=False, indent=1) + "\n"


def main() -> int:
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT} ({len(CASES)} cases)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
