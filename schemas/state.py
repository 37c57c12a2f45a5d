"""Per-run state: a value kept as bytes in RocksDB, bounded by historySize, the
warning-key cap and the guard window."""

from __future__ import annotations

from msgspec import Struct, field

from schemas.verdicts import COMPACTION_LOOP_PERSISTED, AbortError, DetectorName

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
BLOCKED_RAN = 8
"""Shadow mode: the call's verdict would have been a block, and it ran; its result releases no latch (spec §8.2)."""


class Record(Struct, array_like=True, gc=False):
    """One tool call in a run's rolling history.

    `flags`, `failure_identity` and `turn` came last so that records stored
    before them decode (as plain outcomes); `failure_identity` is set only
    with TERMINAL_FAILURE. `turn` is kept only while the call waits for its
    outcome: that is all the turn rule of spec §8.1 asks of it."""

    tool: str
    args_hash: str
    call_id: str | None = None
    kind: int = KIND_OTHER
    result_hash: str | None = None
    unknown_tool: str | None = None
    flags: int = 0
    failure_identity: str | None = None
    turn: str | None = None


class Triple(Struct, array_like=True, gc=False, frozen=True):
    """What the post-compaction guard compares: (tool, args hash, result hash)."""

    tool: str
    args_hash: str
    result_hash: str


class Abort(Struct, array_like=True, gc=False, frozen=True):
    """Why a run was aborted; later calls of the run are answered with it.

    `error` came after the first three so that aborts stored before it decode
    as the guard's; `detector` last, set only where the loop's detector is not
    the error's name (a recovery abort, spec §8.3)."""

    tool: str
    count: int
    message: str
    error: AbortError = COMPACTION_LOOP_PERSISTED
    detector: DetectorName | None = None


class Block(Struct, array_like=True, gc=False, frozen=True):
    """A blocked call's verdict, as the calls that its latch or its turn
    blocks after it repeat it (spec §8.1, §8.2)."""

    tool: str
    detector: DetectorName
    count: int
    warning_key: str | None = None
    paired_tool_name: str | None = None


class Latch(Struct, array_like=True, gc=False, frozen=True):
    """A loop the detectors blocked, kept blocked until something else runs
    (spec §8.2): calls of the block's tool with `args_hash` (every call of
    that tool when None: a missing tool) and, for a ping-pong, the paired side."""

    block: Block
    args_hash: str | None
    paired_tool: str | None = None
    paired_args_hash: str | None = None

    def covers(self, tool: str, args_hash: str) -> bool:
        if tool == self.block.tool and (self.args_hash is None or args_hash == self.args_hash):
            return True
        return tool == self.paired_tool and args_hash == self.paired_args_hash


MAX_UNFINISHED = 256
"""Calls kept per run after they left the history without a result (oldest dropped)."""
MAX_LATCHES = 32
"""Latches kept per run (oldest dropped); one per warning key, and all go at the next real outcome."""
MAX_BLOCKED_TURNS = 32
"""Blocked turns remembered per run (oldest dropped): a turn's calls come together, so only the newest matter."""
OWN_TURN = ""
"""`first_blocked_turn` of a run whose first blocked call had no turn: a turn of its own, equal to none."""


class RunState(Struct, kw_only=True, dict=True):
    """Everything the engine knows about one run.

    `dict=True` lets the engine keep an index of `history` beside the fields
    (streams.engine.engine._seen); only the fields are encoded. `unfinished`
    holds, by call id, the calls that left the history before their result
    arrived, so that a result sent without args still takes its call's args
    hash (and a veto record that left the history, so that a veto result for
    it still changes nothing); a state stored before it existed decodes with it
    empty, as with the policy's `tool_calls` and `escalation` and §8's
    latches, blocked turns and first blocked turn.
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
    latches: list[Latch] = field(default_factory=list)
    """Loops the detectors blocked that nothing else has run since, oldest first (spec §8.2)."""
    blocked_turns: dict[str, Block] = field(default_factory=dict)
    """Each turn with a blocked call, and its first block (spec §8.1)."""
    first_blocked_turn: str | None = None
    """The turn of the run's first blocked call (OWN_TURN when it had none), for recovery (spec §8.3)."""


class StoredRun(Struct, array_like=True):
    """A run as the stream processor keeps it in its table: the engine's state
    plus the wall-clock time (Unix seconds) the run was last touched, for the
    idle TTL. The engine has no clock; only the stream processor reads this."""

    touched: float
    state: RunState
