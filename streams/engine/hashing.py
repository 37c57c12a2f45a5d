"""What counts as "the same": args and result hashes, byte-compatible with the
reference gateway so a gateway may send precomputed hashes instead of payloads.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct

from schemas.events import MAX_ID_CHARS
from schemas.state import (
    KIND_COMMAND_STATUS,
    KIND_OTHER,
    KIND_PROCESS_LOG,
    KIND_PROCESS_POLL,
    KIND_VOLATILE_SEND,
)
from streams.engine.stablejson import UNDEFINED, python_outcome_json, python_stable_json, speedups, stable_json

POLL_KINDS = frozenset({KIND_PROCESS_POLL, KIND_PROCESS_LOG, KIND_COMMAND_STATUS})

SEND_ACTIONS = frozenset(
    {"send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment", "upload-file", "sticker", "poll"}
)
VOLATILE_SEND_KEYS = frozenset(
    {
        "messageId",
        "message_id",
        "messageIds",
        "platformMessageId",
        "platformMessageIds",
        "fileId",
        "file_id",
        "fileKey",
        "pollId",
        "poll_id",
        "receipt",
        "runId",
        "idempotencyKey",
        "ts",
        "timestamp",
        "sentAt",
        "deliveredAt",
        "createdAt",
    }
)

# JavaScript's String#trim set, which is also its regular expressions' \s;
# Python's str.strip and \s also take \x1c-\x1f and \x85, and \s lacks \ufeff.
_JS_WHITESPACE = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_SPACE = "".join(f"\\u{ord(c):04x}" for c in _JS_WHITESPACE)  # the set, for a [character class]
# The reference's /i without /u folds ASCII letters only (Python would also
# match the Kelvin sign for "k" and the long s for "s"): re.ASCII.
_UNKNOWN_TOOL = tuple(
    re.compile(pattern, re.ASCII | re.IGNORECASE)
    for pattern in (
        f"unknown tool[:{_JS_SPACE}]+[\"']?([a-z0-9_.-]+)",
        f"tool[{_JS_SPACE}]+[\"']?([a-z0-9_.-]+)[\"']?[{_JS_SPACE}]+(?:not found|is not available)",
    )
)


def js_trim(text: str) -> str:
    return text.strip(_JS_WHITESPACE)


def python_digest(value: Any) -> str:
    """sha256 hex of the stable JSON: the definition, and the whole of `digest`
    without the C extension."""
    return hashlib.sha256(python_stable_json(value)).hexdigest()


def _digest_with_speedups(value: Any) -> str:
    return speedups.stable_digest(value) or python_digest(value)


digest = python_digest if speedups is None else _digest_with_speedups


def python_outcome_digest(value: Any) -> str:
    """sha256 hex of an outcome's stable JSON, untrusted-content markers made
    stable: the definition, and the whole of `outcome_digest` without the C extension."""
    return hashlib.sha256(python_outcome_json(value)).hexdigest()


def _outcome_digest_with_speedups(value: Any) -> str:
    return speedups.outcome_digest(value) or python_outcome_digest(value)


outcome_digest = python_outcome_digest if speedups is None else _outcome_digest_with_speedups
"""What every result hash is taken with (args hashes take `digest`: the reference
canonicalises markers in outcomes only)."""


def plan_shape(value: Any) -> Any:
    """update_plan reduced to its shape: rewording a plan is not progress."""
    if not isinstance(value, dict):
        return value
    plan = value.get("plan")
    steps = plan if isinstance(plan, list) else []
    statuses = []
    presence = []
    for step in steps:
        if isinstance(step, dict):
            status = step.get("status")
            text = step.get("step")
            statuses.append(status if isinstance(status, str) else None)
            presence.append(isinstance(text, str) and bool(js_trim(text)))
        else:
            statuses.append(None)
            presence.append(False)
    explanation = value.get("explanation")
    return {
        "planLength": len(steps),
        "statuses": statuses,
        "stepPresence": presence,
        "hasExplanation": isinstance(explanation, str) and bool(js_trim(explanation)),
    }


def args_hash(tool: str, args: Any) -> str:
    """`tool:sha256(stable_json(args))`; absent args hash as JavaScript's undefined."""
    if args is UNSET:
        args = UNDEFINED
    elif tool == "update_plan":
        args = plan_shape(args)
    return f"{tool}:{digest(args)}"


def classify(tool: str, args: Any) -> int:
    """Decide from the call's args how its result is hashed and whether it polls."""
    if tool == "command_status":
        return KIND_COMMAND_STATUS
    if tool == "sessions_send":
        return KIND_VOLATILE_SEND
    if isinstance(args, dict):
        action = args.get("action")
        if tool == "process":
            if action == "poll":
                return KIND_PROCESS_POLL
            if action == "log":
                return KIND_PROCESS_LOG
        elif tool == "message" and isinstance(action, str) and action in SEND_ACTIONS:
            return KIND_VOLATILE_SEND
    return KIND_OTHER


def error_text(error: Any) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, bool):
        return "true" if error else "false"
    if isinstance(error, msgspec.Raw):  # a number in JavaScript's spelling; non-finite ones are quoted
        text = bytes(error).decode()
        return json.loads(text) if text.startswith('"') else text
    if isinstance(error, int):
        return stable_json(error).decode()
    return stable_json(error).decode("utf-8", "surrogatepass")


def unknown_tool_name(text: str) -> str | None:
    """The missing tool an error names, lower-cased, if it names one."""
    text = js_trim(text)
    if not text:
        return None
    for pattern in _UNKNOWN_TOOL:
        match = pattern.search(text)
        if match:
            name = match.group(1).lower()
            # A record keeps the name: one beyond the id bound is kept as its digest.
            return name if len(name) <= MAX_ID_CHARS else "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return None


def _text_content(result: dict[str, Any]) -> str:
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    parts = []
    for entry in content:
        if isinstance(entry, dict):
            text = entry.get("text")
            if isinstance(text, str) and isinstance(entry.get("type"), str):
                parts.append(text)
    return "\n".join(parts).strip(_JS_WHITESPACE)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, msgspec.Raw)) and not isinstance(value, bool)


def _str_or(value: Any, default: Any) -> Any:
    return value if isinstance(value, str) else default


class ResultHashes(Struct, frozen=True, gc=False):
    """Everything a finished call's outcome contributes to the history, and so
    everything a gateway that hashes locally must send (spec §7.5).

    No `result_hash` means no outcome (nothing sent), unless `outcome_kind` is
    "veto"."""

    result_hash: str | None = None
    unknown_tool_name: str | None = None
    outcome_kind: Literal["veto", "terminal_failure"] | None = None
    failure_identity: str | None = None
    no_progress: bool = False


def wire_fields(hashes: ResultHashes) -> dict[str, Any]:
    """The `tool_result` fields that carry `hashes`, those that are set."""
    fields: dict[str, Any] = {}
    for name in ("result_hash", "unknown_tool_name", "outcome_kind", "failure_identity"):
        value = getattr(hashes, name)
        if value is not None:
            fields[name] = value
    if hashes.no_progress:
        fields["no_progress"] = True
    return fields


NO_OUTCOME = ResultHashes()
VETO_OUTCOME = ResultHashes(outcome_kind="veto")
UNCHANGED_WRITE = ResultHashes(outcome_digest({"status": "unchanged"}), no_progress=True)
"""A write whose `details.changed` is false changed nothing: not progress."""

# The parts of a failure's output that change between two runs of one failing
# command, replaced in this order (spec §7.1), as the reference's JavaScript
# patterns match them: \d is ASCII, \s is JavaScript's white space, and with its
# /iu flags "s" also matches the long s (U+017F), which with the Kelvin sign
# (U+212A) is also a word character for \b.
_WORD = "A-Za-z0-9_\u017f\u212a"
_START, _END = f"(?<![{_WORD}])", f"(?![{_WORD}])"  # \\b before a word character, after one
_S = "[s\u017f]"
_CLOCK = (
    re.compile(
        "[0-9]{4}-[0-9]{2}-[0-9]{2}[t ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]{1,6})?(?:z|[+-][0-9]{2}:[0-9]{2})?", re.I
    ),
    re.compile("[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]{1,6})?"),
)
_ATTEMPT = re.compile(f"{_START}(?:attempt|retry){_END}[{_JS_SPACE}#:=]*[0-9]+", re.I)
# The digit comes first and the \\b after it, as a look-behind over both, so
# that the search jumps from digit to digit.
_DURATION = re.compile(
    f"[0-9](?<![{_WORD}][0-9])[0-9]*(?:\\.[0-9]+)?[{_JS_SPACE}]?"
    f"(?:n{_S}|u{_S}|m{_S}|{_S}econd{_S}?|minute{_S}?|hour{_S}?|{_S}){_END}",
    re.I,
)
_PID = re.compile(f"{_START}(?:pid|ppid){_END}[{_JS_SPACE}#:=]*[0-9]+", re.I)


def failure_shape(output: str) -> str:
    """A failure's output without its time stamps, durations, attempt numbers
    and pids, replaced in that order. A pattern whose fixed text is absent is
    not run (the words hold no letter that folds from outside ASCII)."""
    if ":" in output:
        for pattern in _CLOCK:
            output = pattern.sub("#", output)
    lower = output.lower()
    if "attempt" in lower or "retry" in lower:
        output = _ATTEMPT.sub("#", output)
    output = _DURATION.sub("#", output)
    if "pid" in lower:
        output = _PID.sub("#", output)
    return output


def _number_text(value: Any) -> str:
    """A payload number as JavaScript prints it (`${n}`)."""
    return bytes(value).decode() if isinstance(value, msgspec.Raw) else stable_json(value).decode()


def _is_failure_exit(exit_code: Any) -> bool:
    """A finite number other than 0 (a non-finite one is a quoted msgspec.Raw)."""
    if isinstance(exit_code, msgspec.Raw):
        text = bytes(exit_code)
        return not text.startswith(b'"') and text != b"0"
    return isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0


def _exec_outcome(details: dict[str, Any], text: str) -> ResultHashes | None:
    """exec: only the stable outcome; durations, pids and session ids never count.
    A command that ran to a non-zero exit with real output is a terminal failure,
    with an identity that two runs differing only in volatile output share."""
    status = details.get("status")
    if not isinstance(status, str) or not status:
        return None
    if status == "running":
        return ResultHashes(outcome_digest({"status": status, "tail": _str_or(details.get("tail"), "")}))
    if status in ("completed", "failed"):
        exit_code = details.get("exitCode")
        aggregated = details.get("aggregated")
        aggregated = js_trim(aggregated) if isinstance(aggregated, str) else ""
        output = aggregated or text
        timed_out = details.get("timedOut") is True
        result_hash = outcome_digest(
            {
                "status": status,
                "exitCode": exit_code if _is_number(exit_code) else None,
                "timedOut": timed_out,
                "output": output,
            }
        )
        if (
            timed_out
            or not _is_failure_exit(exit_code)
            or not output
            or output == f"(Command exited with code {_number_text(exit_code)})"
        ):
            return ResultHashes(result_hash)
        identity = outcome_digest(
            {"status": status, "exitCode": exit_code, "timedOut": False, "output": failure_shape(output)}
        )
        return ResultHashes(result_hash, outcome_kind="terminal_failure", failure_identity=identity)
    if status in ("approval-pending", "approval-unavailable"):
        return ResultHashes(
            outcome_digest(
                {
                    "status": status,
                    "reason": _str_or(details.get("reason"), None),
                    "host": _str_or(details.get("host"), None),
                    "command": _str_or(details.get("command"), ""),
                    "warningText": _str_or(details.get("warningText"), ""),
                }
            )
        )
    return None


_POLL_FIELDS = ("exitCode", "exitSignal", "aggregated")
_LOG_FIELDS = ("totalLines", "totalChars", "truncated", "exitCode", "exitSignal")


def _process_outcome(action: str, fields: tuple[str, ...], details: dict[str, Any], text: str) -> str:
    shape: dict[str, Any] = {"action": action, "status": details.get("status", UNDEFINED), "text": text}
    for name in fields:
        shape[name] = details.get(name)
    return outcome_digest(shape)


def _is_message_object(value: dict[str, Any]) -> bool:
    return (
        isinstance(value.get("id"), str)
        and isinstance(value.get("text"), str)
        and (
            isinstance(value.get("direction"), str)
            or isinstance(value.get("senderId"), str)
            or isinstance(value.get("accountId"), str)
            or isinstance(value.get("conversation"), dict)
        )
    )


def strip_volatile(value: Any) -> Any:
    """A sent message's fresh ids and timestamps are not progress: drop them at any depth."""
    if isinstance(value, list):
        return [strip_volatile(item) for item in value]
    if not isinstance(value, dict):
        return value
    drop_id = _is_message_object(value)
    return {
        key: strip_volatile(item)
        for key, item in value.items()
        if key not in VOLATILE_SEND_KEYS and not (drop_id and key == "id")
    }


def result_outcome(tool: str, kind: int, result: Any, error: Any) -> ResultHashes:
    """What a finished call's outcome is, from its payload; `kind` is how its call
    was classified (`classify`), which a result sent without args takes from its call."""
    if error is not UNSET and error is not None:
        text = error_text(error)
        return ResultHashes("error:" + outcome_digest(text), unknown_tool_name(text), no_progress=True)
    if result is UNSET:
        return NO_OUTCOME
    if not isinstance(result, dict):
        return ResultHashes(outcome_digest(result))
    raw_details = result.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    if details.get("status") == "blocked" and details.get("deniedReason") == "tool-loop":
        return VETO_OUTCOME
    text = _text_content(result)
    if tool == "exec":
        outcome = _exec_outcome(details, text)
        if outcome is not None:
            return outcome
    if tool == "write" and details.get("changed") is False:
        return UNCHANGED_WRITE
    if kind == KIND_PROCESS_POLL:
        return ResultHashes(_process_outcome("poll", _POLL_FIELDS, details, text))
    if kind == KIND_PROCESS_LOG:
        return ResultHashes(_process_outcome("log", _LOG_FIELDS, details, text))
    if kind == KIND_VOLATILE_SEND:
        return ResultHashes(outcome_digest(strip_volatile(details)))
    if tool == "update_plan":
        return ResultHashes(outcome_digest({"details": plan_shape(details), "text": ""}))
    return ResultHashes(outcome_digest({"details": details, "text": text}))


def hash_result(tool: str, args: Any, result: Any, error: Any) -> ResultHashes:
    """All the result fields a gateway can hash locally, from the call's tool and
    args and its result or error: the engine's own rules (`result_outcome`)."""
    return result_outcome(tool, classify(tool, args), result, error)
