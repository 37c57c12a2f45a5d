"""Per-run state: a value kept as bytes in RocksDB, bounded by historySize, the
warning-key cap and the guard window."""

from __future__ import annotations

from msgspec import Struct, field

from schemas.verdicts import COMPACTION_LOOP_PERSISTED, AbortError

# How a result must be hashed, decided from the call's args when the call is
# recorded, so that a result arriving without args is still hashed correctly.
KIND_OTHER = 0
KIND_PROCESS_POLL = 1
KIND_PROCESS_LOG = 2
KIND_VOLATILE_SEND = 3
KIND_COMMAND_STATUS = 4

# Record.flags: what a finished call's outcome was, beyond its result hash.
VETO = 1
"""The call was vetoed (blocked by this engine, or another guard's veto result): no result hash."""
NO_PROGRESS = 2
"""The outcome itself says "no progress": an error, or a write that changed nothing."""
TERMINAL_FAILURE = 4
"""An `exec` that ran to a non-zero exit with output (spec §7.1)."""


class Record(Struct, array_like=True, gc=False):
    """One tool call in a run's rolling history.

    `flags` and `failure_identity` came last so that records stored before
    them decode (as plain outcomes); `failure_identity` is set only with
    TERMINAL_FAILURE."""

    tool: str
    args_hash: str
    call_id: str | None = None
    kind: int = KIND_OTHER
    result_hash: str | None = None
    unknown_tool: str | None = None
    flags: int = 0
    failure_identity: str | None = None


class Triple(Struct, array_like=True, gc=False, frozen=True):
    """What the post-compaction guard compares: (tool, args hash, result hash)."""

    tool: str
    args_hash: str
    result_hash: str


class Abort(Struct, array_like=True, gc=False, frozen=True):
    """Why a run was aborted; later calls of the run are answered with it.

    `detector` came last so that aborts stored before it decode as the guard's."""

    tool: str
    count: int
    message: str
    detector: AbortError = COMPACTION_LOOP_PERSISTED


MAX_UNFINISHED = 256
"""Calls kept per run after they left the history without a result (oldest dropped)."""


class RunState(Struct, kw_only=True, dict=True):
    """Everything the engine knows about one run.

        `dict=True` lets the engine keep an index of `history` beside the fields
        (streams.engine.engine._seen); only the fields are encoded. `unfinished`
        holds, by call id, the calls that left the history before their result
        arrived, so that a result sent without args still takes its call's args
        hash (and a veto record that left the history, so that a veto result for
    it still changes nothing); a state stored before it existed decodes with it
    empty, as with the policy's `tool_calls` and `escalation`.
    """

    last_seq: int = -1
    agent_id: str | None = None
    history: list[Record] = field(default_factory=list)
    warning_buckets: dict[str, int] = field(default_factory=dict)
    guard_remaining: int = 0
    guard_window: list[Triple] = field(default_factory=list)
    aborted: Abort | None = None
    unfinished: dict[str, Record] = field(default_factory=dict)
    tool_calls: int = 0
    """Tool calls numbered so far, under a policy (the budget's count)."""
    escalation: list[bool] = field(default_factory=list)
    """Under a policy with escalation, whether each of the last `window` judged calls was blocked."""


class StoredRun(Struct, array_like=True):
    """A run as the stream processor keeps it in its table: the engine's state
    plus the wall-clock time (Unix seconds) the run was last touched, for the
    idle TTL. The engine has no clock; only the stream processor reads this."""

    touched: float
    state: RunState
