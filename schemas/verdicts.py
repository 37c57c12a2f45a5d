"""The answer to a tool call, published on the decision topic keyed by run id."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

Decision = Literal["allow", "warn", "block", "abort"]
ShadowDecision = Literal["warn", "block", "abort"]
Level = Literal["none", "warning", "critical"]
DetectorName = Literal[
    "unknown_tool_repeat",
    "global_circuit_breaker",
    "known_poll_no_progress",
    "ping_pong",
    "generic_repeat",
    "argument_churn",
    "compaction_loop_persisted",
    "tool_call_budget",
    "blocks_ignored",
]
AbortError = Literal["compaction_loop_persisted", "tool_call_budget", "blocks_ignored", "loop_recovery_exhausted"]
COMPACTION_LOOP_PERSISTED: Literal["compaction_loop_persisted"] = "compaction_loop_persisted"
TOOL_CALL_BUDGET: Literal["tool_call_budget"] = "tool_call_budget"
BLOCKS_IGNORED: Literal["blocks_ignored"] = "blocks_ignored"
LOOP_RECOVERY_EXHAUSTED: Literal["loop_recovery_exhausted"] = "loop_recovery_exhausted"


class Verdict(Struct, kw_only=True):
    """One per tool call (and one for a tool result that makes the guard abort).

    New fields come last, so a consumer reading a verdict by name reads it as
    before. Consumers deduplicate by `(run_id, seq)`: at-least-once delivery
    may repeat a verdict, always byte-identical.
    """

    run_id: str
    seq: int
    tool_call_id: str
    tool_name: str
    decision: Decision
    level: Level = "none"
    detector: DetectorName | None = None
    count: int = 0
    message: str | None = None
    warning_key: str | None = None
    paired_tool_name: str | None = None
    error: AbortError | None = None
    shadow_decision: ShadowDecision | None = None
    """In shadow mode, what enforce mode would have answered (decision is then allow)."""
    agent_id: str | None = None
    """The run's agent (the first `agent_id` its events named), for aggregates across runs."""
    ts: float | str | None = None
    """The deciding event's `ts` as the gateway sent it (seconds since the epoch or RFC 3339)."""
