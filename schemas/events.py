"""Events a gateway publishes, one JSON object per message, tagged by `type`.

Payloads (`args`, `result`, `error`) are untyped on purpose: the engine hashes
them, it never interprets more of them than the hashing rules need.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

MAX_ID_CHARS = 4096
"""Bound on every id and hash string, so one event cannot bloat a run's stored state."""

RunId = Annotated[
    str, Meta(min_length=1, max_length=MAX_ID_CHARS, description="Agent run id; also the Kafka message key.")
]
Seq = Annotated[
    int,
    Meta(ge=0, le=2**63 - 1, description="Grows within a run; a seq not above the last one seen is a duplicate."),
]
Id = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
ToolName = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
Timestamp = float | str | None
MAX_TURN_CHARS = 256
Turn = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_TURN_CHARS,
        description="The model response (one assistant message) that made the call; calls of one turn are one batch.",
    ),
]
OutcomeKind = Annotated[
    Literal["veto", "terminal_failure"],
    Meta(description="veto: the call was vetoed (no result_hash); terminal_failure: an exec that failed for good."),
]


class _RunEvent(Struct, tag_field="type", kw_only=True):
    run_id: RunId
    seq: Seq
    ts: Timestamp = None


ReplyPartition = Annotated[
    int,
    Meta(
        ge=0,
        le=2**31 - 1,
        description="The decisions topic's partition the gateway reads; its verdict goes there (absent: by run id).",
    ),
]


class _CallEvent(_RunEvent, kw_only=True):
    tool_call_id: Id
    tool_name: ToolName
    args: Any = UNSET
    args_hash: Id | None = None
    reply_partition: ReplyPartition | UnsetType = UNSET


class ToolCall(_CallEvent, tag="tool_call", kw_only=True):
    """The model asks to run a tool; answered by exactly one verdict.

    `turn` names the model response that made the call (spec §8.1): absent
    means a batch of its own, and null is refused, as any non-string is."""

    agent_id: Id | None = None
    session_key: Id | None = None
    turn: Turn | UnsetType = UNSET


class ToolResult(_CallEvent, tag="tool_result", kw_only=True):
    """A finished call; fills the matching history record with its outcome hash.

    A gateway that hashes locally sends `result_hash` and, from the same
    payload, the facts the engine can no longer derive from it (spec §7.5):
    `outcome_kind` ("veto" with no `result_hash`, or "terminal_failure" with
    its `failure_identity`) and `no_progress`."""

    result: Any = UNSET
    error: Any = UNSET
    result_hash: Id | None = None
    unknown_tool_name: Id | None = None
    outcome_kind: OutcomeKind | None = None
    failure_identity: Id | None = None
    no_progress: bool = False


class Compaction(_RunEvent, tag="compaction", kw_only=True):
    """The transcript was summarised and the turn retried: arms the guard."""

    agent_id: Id | None = None


class RunEnd(_RunEvent, tag="run_end", kw_only=True):
    """The run finished: its history and guard are freed."""


Event = ToolCall | ToolResult | Compaction | RunEnd
EVENT_TYPES: tuple[str, ...] = ("tool_call", "tool_result", "compaction", "run_end")


def is_set(value: Any) -> bool:
    """True when an optional payload field was present in the event (even as null)."""
    return value is not UNSET


__all__ = [
    "Compaction",
    "Event",
    "EVENT_TYPES",
    "RunEnd",
    "ToolCall",
    "ToolResult",
    "is_set",
    "msgspec",
]
