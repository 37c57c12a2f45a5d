"""`apply(state, event, config, policy) -> Outcome`: the whole engine.

The engine owns the state it is given: it updates it in place and returns it
(copying a 30-record history per event would be the single largest cost).
Callers that need the old value keep its bytes, which is what the stream
processor does anyway.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
from msgspec import UNSET, Struct, UnsetType

from schemas.config import FleetConfig, LoopDetectionConfig
from schemas.events import Event, RunEnd, ToolCall, ToolResult
from schemas.policy import FleetPolicy, Policy
from schemas.state import (
    BLOCKED_RAN,
    MAX_BLOCKED_TURNS,
    MAX_LATCHES,
    MAX_UNFINISHED,
    NO_PROGRESS,
    OWN_TURN,
    TERMINAL_FAILURE,
    VETO,
    Abort,
    Block,
    Latch,
    Record,
    RunState,
    Triple,
)
from schemas.verdicts import (
    BLOCKS_IGNORED,
    LOOP_RECOVERY_EXHAUSTED,
    TOOL_CALL_BUDGET,
    Decision,
    DetectorName,
    Level,
    ShadowDecision,
    Verdict,
)
from streams.engine import guard
from streams.engine.detectors import Detection, detect, measure
from streams.engine.hashing import (
    POLL_KINDS,
    VETO_OUTCOME,
    ResultHashes,
    args_hash,
    classify,
    error_text,
    result_outcome,
    unknown_tool_name,
)
from streams.engine.trace import Rule, Trace, threshold
from streams.engine.warnings import should_deliver


class Outcome(Struct, gc=False):
    """What one event did: the run's new state, its verdicts (zero or one), the
    guard's window size when this event armed it (for the operator log), and
    whether it was a duplicate (for the counters); with `trace=True`, the
    decision path."""

    state: RunState | None
    verdicts: list[Verdict]
    armed: int = 0
    duplicate: bool = False
    trace: Trace | None = None


def apply(
    state: RunState | None, event: Event, config: FleetConfig, policy: FleetPolicy | None = None, trace: bool = False
) -> Outcome:
    """Apply one event to its run's state (None for a run never seen), under
    the policy file's settings for the run's agent (None: no policy file).

    A duplicate (seq not above the last processed) changes nothing. Hashing
    runs before any change, so an event whose payload cannot be hashed raises
    and leaves the state as it was. `trace` returns the decision path too
    (`streams.engine.trace`), for `loopwarden explain`.
    """
    if state is None:
        state = RunState()
    path = Trace(agent_id=state.agent_id, aborted=state.aborted is not None) if trace else None
    seq = event.seq
    if seq <= state.last_seq:
        return Outcome(state, [], 0, True, path)
    if isinstance(event, RunEnd):
        return Outcome(RunState(last_seq=seq), [], 0, False, path)
    agent_id = state.agent_id
    if agent_id is None and not isinstance(event, ToolResult) and event.agent_id:
        agent_id = event.agent_id
    cfg = config.default if agent_id is None else config.for_agent(agent_id)
    pol = None if policy is None else policy.for_agent(agent_id)
    armed = 0
    verdicts: list[Verdict] = []
    if path is not None:
        path.agent_id = agent_id
    if isinstance(event, ToolCall):
        verdicts.append(_stamp(_on_call(state, event, cfg, pol, path), agent_id, event.ts))
    elif isinstance(event, ToolResult):
        verdict = _on_result(state, event, cfg, pol is not None and pol.shadow, path)
        if verdict is not None:
            verdicts.append(_stamp(verdict, agent_id, event.ts))
    else:
        if state.aborted is None:
            armed = guard.arm(state, cfg)
        if path is not None:
            path.armed = armed
    state.agent_id = agent_id
    state.last_seq = seq
    return Outcome(state, verdicts, armed, False, path)


def _stamp(verdict: Verdict, agent_id: str | None, ts: float | str | None) -> Verdict:
    """What an aggregate across runs needs (the fleet stage): whose run, and when."""
    verdict.agent_id = agent_id
    verdict.ts = ts
    return verdict


def _abort_verdict(event: ToolCall | ToolResult, abort: Abort, shadow: bool = False) -> Verdict:
    """The abort, or in shadow mode its one report: the call runs, the run goes on."""
    return Verdict(
        run_id=event.run_id,
        seq=event.seq,
        tool_call_id=event.tool_call_id,
        tool_name=event.tool_name,
        decision="allow" if shadow else "abort",
        level="critical",
        # Every error but a recovery's names its own detector; a recovery abort keeps its loop's.
        detector=cast(DetectorName, abort.error) if abort.detector is None else abort.detector,
        count=abort.count,
        message=abort.message,
        error=None if shadow else abort.error,
        shadow_decision="abort" if shadow else None,
    )


def _seen(state: RunState) -> dict[str, int]:
    """How many records of each args hash the run's history holds, so that
    `detect` answers a call not in the window without walking it.

    It lives in the state's `__dict__`, which is never encoded: a state decoded
    from bytes or built by hand gets it on first use. The engine changes a
    history only through `_record`, which keeps it exact.
    """
    seen = state.__dict__.get("_seen")
    if seen is None:
        seen = state.__dict__["_seen"] = {}
        for record in state.history:
            seen[record.args_hash] = seen.get(record.args_hash, 0) + 1
    return seen


def _record(state: RunState, seen: dict[str, int], record: Record, size: int) -> None:
    """Append to the run's history (`seen` its index) and drop the oldest
    records beyond `size`; a dropped call still waiting for its result is kept
    in `unfinished`, so that its result can still take its args hash."""
    history = state.history
    history.append(record)
    seen[record.args_hash] = seen.get(record.args_hash, 0) + 1
    excess = len(history) - size
    if excess > 0:
        for old in history[:excess]:
            left = seen[old.args_hash] - 1
            if left:
                seen[old.args_hash] = left
            else:
                del seen[old.args_hash]
            if old.result_hash is None and old.call_id is not None:
                _keep_unfinished(state.unfinished, old.call_id, old)
        del history[:excess]


def _keep_unfinished(unfinished: dict[str, Record], call_id: str, record: Record) -> None:
    unfinished.pop(call_id, None)  # a reused id moves to the newest place
    unfinished[call_id] = record
    if len(unfinished) > MAX_UNFINISHED:
        del unfinished[next(iter(unfinished))]


def _on_call(
    state: RunState, event: ToolCall, cfg: LoopDetectionConfig, pol: Policy | None, trace: Trace | None
) -> Verdict:
    """Policy spec §2 in order: an aborted run, the budget, the detectors (with
    the turn rule and the latches), recovery, escalation. Without a policy
    file, recovery alone applies: it is on by default."""
    if trace is not None:
        _trace_call(trace, state, event)
    if state.aborted is not None:
        verdict = _abort_verdict(event, state.aborted)
        if trace is not None:
            trace.add("aborted", verdict)
        return verdict
    if pol is None:
        verdict = _detect(state, event, cfg, False, trace)
        return _recover(state, event, verdict, False, trace) if verdict.decision == "block" else verdict
    state.tool_calls += 1
    if state.tool_calls == pol.max_tool_calls + 1 and pol.max_tool_calls:
        verdict = _over_budget(state, event, cfg, pol)
        if trace is not None:
            trace.add("budget", verdict, pol.max_tool_calls)
        return verdict
    verdict = _detect(state, event, cfg, pol.shadow, trace)
    blocked = verdict.decision == "block" or verdict.shadow_decision == "block"
    if blocked and pol.recovery:
        verdict = _recover(state, event, verdict, pol.shadow, trace)
    if not pol.escalation:
        return verdict
    verdict = _escalate(state, event, verdict, pol, blocked)
    if trace is not None:  # counted against blockedCalls: the blocked calls it remembers (cleared by a shadow abort)
        blocked_calls = verdict.count if verdict.detector == BLOCKS_IGNORED else state.escalation.count(True)
        trace.add("escalation", verdict, pol.blocked_calls, count=blocked_calls)
    return verdict


def _trace_call(trace: Trace, state: RunState, event: ToolCall) -> None:
    """What the detectors measure for this call, on the history as they see it
    (with its turn's open calls as vetoes), before any rule decides it."""
    signature = call_signature(event)
    kind = classify(event.tool_name, event.args)
    turn = call_turn(event)
    history = state.history
    view = history if turn is None else projected(history, turn)
    trace.args_hash, trace.kind, trace.turn = signature, kind, turn
    trace.pending = sum(1 for seen, real in zip(view, history, strict=True) if seen is not real)
    trace.measures = measure(view, event.tool_name, signature, kind in POLL_KINDS)


def _recover(state: RunState, event: ToolCall, verdict: Verdict, shadow: bool, trace: Trace | None) -> Verdict:
    if trace is not None:
        trace.first_blocked_turn = state.first_blocked_turn
    verdict = _recovery(state, event, verdict, shadow)
    if trace is not None:
        trace.add("recovery", verdict)
    return verdict


def _recovery(state: RunState, event: ToolCall, verdict: Verdict, shadow: bool) -> Verdict:
    """Spec §8.3: a block in another turn than the run's first blocked one
    means the loop came back after its block, and the run ends. In shadow
    mode that is reported once, and this call's turn becomes the first."""
    turn = call_turn(event) or OWN_TURN
    first = state.first_blocked_turn
    if first is None:
        state.first_blocked_turn = turn
        return verdict
    if turn != OWN_TURN and turn == first:
        return verdict
    tool = event.tool_name
    message = (
        f"ABORTED (loop_recovery_exhausted): the {verdict.detector} loop on {tool} came back after it was "
        f"blocked (count {verdict.count}), so the run is stopped. Report what was done and that the task is stuck."
    )
    if shadow:
        state.first_blocked_turn = turn
        return msgspec.structs.replace(verdict, shadow_decision="abort", message=message)
    state.aborted = Abort(tool, verdict.count, message, LOOP_RECOVERY_EXHAUSTED, verdict.detector)
    return msgspec.structs.replace(verdict, decision="abort", message=message, error=LOOP_RECOVERY_EXHAUSTED)


def _over_budget(state: RunState, event: ToolCall, cfg: LoopDetectionConfig, pol: Policy) -> Verdict:
    limit = pol.max_tool_calls
    abort = Abort(
        event.tool_name,
        limit,
        f"ABORTED (tool_call_budget): this run used its budget of {limit} tool calls, and {event.tool_name} "
        "would be one more. The run is stopped; report what was done and what is left.",
        TOOL_CALL_BUDGET,
    )
    if not pol.shadow:
        state.aborted = abort
        return _abort_verdict(event, abort)
    # It ran: recorded as an allowed call, and the run goes on to be judged by the detectors.
    tool = event.tool_name
    _record(
        state,
        _seen(state),
        _call_record(event, tool, call_signature(event), classify(tool, event.args)),
        cfg.history_size,
    )
    return _abort_verdict(event, abort, True)


def _escalate(state: RunState, event: ToolCall, verdict: Verdict, pol: Policy, blocked: bool) -> Verdict:
    """Remember whether this judged call was blocked (a call that recovery
    aborted was); abort when blocked calls reach `blockedCalls` among the
    last `window`, unless recovery already did."""
    memory = state.escalation
    memory.append(blocked)
    if len(memory) > pol.window:
        del memory[: len(memory) - pol.window]
    if not blocked or verdict.decision == "abort" or verdict.shadow_decision == "abort":
        return verdict
    count = memory.count(True)
    if count < pol.blocked_calls:
        return verdict
    abort = Abort(
        event.tool_name,
        count,
        f"ABORTED (blocks_ignored): {event.tool_name} was blocked again; the run kept calling what was "
        f"blocked ({count} of its last {len(memory)} calls). The run is stopped: report the task as failed.",
        BLOCKS_IGNORED,
    )
    if pol.shadow:
        memory.clear()
        return _abort_verdict(event, abort, True)
    state.aborted = abort
    return _abort_verdict(event, abort)


def _detect(state: RunState, event: ToolCall, cfg: LoopDetectionConfig, shadow: bool, trace: Trace | None) -> Verdict:
    """The rolling detectors (spec §4, §7), then the turn rule and the latches
    (§8.1, §8.2) for a call they would allow or warn. In shadow mode a
    would-be block is recorded as the allowed call it is, since the gateway
    runs it."""
    tool = event.tool_name
    signature = call_signature(event)
    kind = classify(tool, event.args)
    turn = call_turn(event)
    history = state.history
    seen = _seen(state)
    found: Detection | None = None
    if cfg.rolling:
        view = history if turn is None else projected(history, turn)
        found = detect(view, tool, signature, kind in POLL_KINDS, cfg, seen)
    if found is not None and found.level == "critical":
        block = Block(tool, found.detector, found.count, found.warning_key, found.paired_tool_name)
        message = found.message
        _latch(state, block, signature, history)
        rule: Rule = "detectors"
    else:
        # Latches and blocked turns exist only in runs that had a block: most calls skip both.
        standing = standing_block(state, turn, tool, signature) if state.latches or state.blocked_turns else None
        if standing is None:
            _record(state, seen, _call_record(event, tool, signature, kind), cfg.history_size)
            if found is None:  # the common case, answered at once
                verdict = Verdict(
                    run_id=event.run_id,
                    seq=event.seq,
                    tool_call_id=event.tool_call_id,
                    tool_name=tool,
                    decision="allow",
                )
            else:
                verdict = _warning(state, event, found, shadow)
            if trace is not None:
                trace.add("detectors", verdict, None if found is None else threshold(found, cfg))
            return verdict
        rule = "turn" if turn is not None and turn in state.blocked_turns else "latch"
        block, message = standing
    # Blocked: by the detectors, by the turn rule, or by a latch.
    if turn is not None:
        _remember_blocked_turn(state.blocked_turns, turn, block)
    decision: Decision = "block"
    shadow_decision: ShadowDecision | None = None
    if shadow:  # it runs, so it is an open call; its result releases no latch
        decision, shadow_decision = "allow", "block"
        record = _call_record(event, tool, signature, kind, BLOCKED_RAN)
    else:
        # A veto record: it adds to the no-progress streak, so a run that keeps
        # trying a blocked call reaches the circuit breaker (spec §7.1).
        record = Record(tool, signature, event.tool_call_id, kind, flags=VETO)
    _record(state, seen, record, cfg.history_size)
    verdict = _loop_verdict(event, decision, shadow_decision, "critical", block, message)
    if trace is not None:
        trace.add(rule, verdict, threshold(found, cfg) if rule == "detectors" and found else None, block.tool)
    return verdict


def _warning(state: RunState, event: ToolCall, found: Detection, shadow: bool) -> Verdict:
    """A warning, delivered only when its bucket rises (spec §4)."""
    decision: Decision = "warn" if should_deliver(state.warning_buckets, found.warning_key, found.count) else "allow"
    shadow_decision: ShadowDecision | None = None
    if shadow and decision == "warn":
        decision, shadow_decision = "allow", "warn"
    loop = Block(event.tool_name, found.detector, found.count, found.warning_key, found.paired_tool_name)
    return _loop_verdict(event, decision, shadow_decision, found.level, loop, found.message)


def _loop_verdict(
    event: ToolCall,
    decision: Decision,
    shadow_decision: ShadowDecision | None,
    level: Level,
    loop: Block,
    message: str,
) -> Verdict:
    """A verdict on a loop: the detectors' warning or block, or a block that stands for this call."""
    return Verdict(
        run_id=event.run_id,
        seq=event.seq,
        tool_call_id=event.tool_call_id,
        tool_name=event.tool_name,
        decision=decision,
        level=level,
        detector=loop.detector,
        count=loop.count,
        message=message,
        warning_key=loop.warning_key,
        paired_tool_name=loop.paired_tool_name,
        shadow_decision=shadow_decision,
    )


def call_turn(event: ToolCall) -> str | None:
    turn = event.turn
    return None if isinstance(turn, UnsetType) else turn


def _call_record(event: ToolCall, tool: str, signature: str, kind: int, flags: int = 0) -> Record:
    """The record of a call that runs: open until its outcome, with its turn while it waits."""
    return Record(tool, signature, event.tool_call_id, kind, flags=flags, turn=call_turn(event))


def projected(history: list[Record], turn: str) -> list[Record]:
    """The history as the detectors see a call of `turn`: the earlier calls of
    the turn still waiting for their outcome count as vetoes (spec §8.1), as a
    gateway projects a batch it admits. The records themselves stay open."""
    view: list[Record] | None = None
    for i, record in enumerate(history):
        if record.turn == turn and record.result_hash is None and not record.flags & VETO:
            if view is None:
                view = list(history)
            view[i] = Record(record.tool, record.args_hash, record.call_id, record.kind, flags=VETO)
    return history if view is None else view


def _latch(state: RunState, block: Block, signature: str, history: list[Record]) -> None:
    """Keep the loop the detectors just blocked blocked (spec §8.2): a missing
    tool by name, a ping-pong on both sides (the paired one is the run's
    newest record), any other loop on this call's args. It replaces the latch
    of the same warning key and becomes the newest."""
    if block.detector == "unknown_tool_repeat":
        latch = Latch(block, None)
    elif block.detector == "ping_pong" and history:
        newest = history[-1]
        latch = Latch(block, signature, newest.tool, newest.args_hash)
    else:
        latch = Latch(block, signature)
    latches = [kept for kept in state.latches if kept.block.warning_key != block.warning_key]
    latches.append(latch)
    state.latches = latches[-MAX_LATCHES:]


def standing_block(state: RunState, turn: str | None, tool: str, signature: str) -> tuple[Block, str] | None:
    """The block that stands for a call the detectors let through, and its
    message: its turn's first block (spec §8.1), else the newest latch that
    covers it (§8.2)."""
    if turn is not None and state.blocked_turns:
        block = state.blocked_turns.get(turn)
        if block is not None:
            return block, (
                f"CRITICAL: another call of this turn ({block.tool}) was blocked as a {block.detector} loop "
                f"(count {block.count}), so {tool} is blocked with it: no call of a blocked turn runs."
            )
    for latch in reversed(state.latches):
        if latch.covers(tool, signature):
            block = latch.block
            return block, (
                f"CRITICAL: the {block.detector} loop on {block.tool} is still blocked (count {block.count}): "
                "nothing else has run since it was blocked. Do something different that makes progress, "
                "or report the task as failed."
            )
    return None


def _remember_blocked_turn(turns: dict[str, Block], turn: str, block: Block) -> None:
    """A turn's first block stands for its later calls (oldest turns dropped beyond the bound)."""
    if turn in turns:
        return
    turns[turn] = block
    if len(turns) > MAX_BLOCKED_TURNS:
        del turns[next(iter(turns))]


def find_open_call(history: list[Record], call_id: str, tool: str, signature: str | None) -> Record | None:
    """Newest record of this call still waiting for its result, or its veto record
    when it was vetoed (blocked, or another guard's veto result)."""
    for record in reversed(history):
        if record.result_hash is not None or record.call_id != call_id:
            continue
        if signature is None or (record.tool == tool and record.args_hash == signature):
            return record
    return None


def open_call(state: RunState, event: ToolResult, signature: str | None) -> tuple[Record | None, bool]:
    """The call a result completes, and whether it had left the history: its
    record in the history, else, for a result that names no args, the call
    that left the history unfinished (the gateway still knows that call's
    args; so does this)."""
    record = find_open_call(state.history, event.tool_call_id, event.tool_name, signature)
    if record is None and signature is None and state.unfinished:
        record = state.unfinished.get(event.tool_call_id)
        return record, record is not None
    return record, False


def call_signature(event: ToolCall) -> str:
    """A call's args hash: as sent, else computed from its args."""
    return event.args_hash or args_hash(event.tool_name, event.args)


def result_signature(event: ToolResult) -> str | None:
    """The args hash a result names (its own, or its args'), or None when it
    names none and takes that of the call it completes."""
    if event.args_hash:
        return event.args_hash
    return None if event.args is UNSET else args_hash(event.tool_name, event.args)


def result_kind(record: Record | None, tool: str, args: Any) -> int:
    """How a result is hashed: by its own args when it has them, else by the
    call it completes, else by its tool name alone."""
    return record.kind if record is not None and args is UNSET else classify(tool, args)


def result_facts(event: ToolResult, kind: int) -> ResultHashes:
    """The outcome a result reports: as a gateway that hashed it locally sent it
    (spec §7.5), else hashed here from its payload."""
    if event.outcome_kind == "veto":
        return VETO_OUTCOME
    if event.result_hash:
        errored = event.error is not UNSET and event.error is not None
        unknown = event.unknown_tool_name or None
        if unknown is None and errored:
            unknown = unknown_tool_name(error_text(event.error))
        terminal = event.outcome_kind == "terminal_failure"
        return ResultHashes(
            event.result_hash,
            unknown,
            event.outcome_kind,
            event.failure_identity if terminal else None,
            event.no_progress or errored,
        )
    facts = result_outcome(event.tool_name, kind, event.result, event.error)
    if event.unknown_tool_name and facts.result_hash is not None:
        facts = msgspec.structs.replace(facts, unknown_tool_name=event.unknown_tool_name)
    return facts


def _flags(facts: ResultHashes) -> int:
    flags = NO_PROGRESS if facts.no_progress else 0
    if facts.outcome_kind == "terminal_failure":
        flags |= TERMINAL_FAILURE
    return flags


def _on_result(
    state: RunState, event: ToolResult, cfg: LoopDetectionConfig, shadow: bool, trace: Trace | None
) -> Verdict | None:
    if state.aborted is not None:
        if trace is not None:  # ignored, but shown with what it reported
            signature = result_signature(event)
            record, late = open_call(state, event, signature)
            _trace_result(
                trace, signature, record, late, result_facts(event, result_kind(record, event.tool_name, event.args))
            )
        return None
    tool = event.tool_name
    signature = result_signature(event)
    record, late = open_call(state, event, signature)
    facts = result_facts(event, result_kind(record, tool, event.args))
    if trace is not None:
        _trace_result(trace, signature, record, late, facts)
    result_hash = facts.result_hash
    vetoed = record is not None and bool(record.flags & VETO)
    if result_hash is None and (facts.outcome_kind != "veto" or vetoed):
        # No outcome; or a veto for a call already vetoed (this engine's own
        # block): nothing more, so a gateway need not report its vetoes.
        if vetoed and late:
            del state.unfinished[event.tool_call_id]
        return None
    if late:
        del state.unfinished[event.tool_call_id]
    if (
        state.latches
        and result_hash is not None
        and record is not None
        and not vetoed
        and not record.flags & BLOCKED_RAN
    ):
        # A call that was allowed ran to an outcome: the model did something else (spec §8.2).
        if trace is not None:
            trace.latches_released = len(state.latches)
        state.latches = []
    append = late or record is None or vetoed
    if record is None:
        kind = result_kind(None, tool, event.args)
        record = Record(tool, signature or args_hash(tool, event.args), event.tool_call_id, kind)
    elif vetoed:  # the gateway ran a vetoed call after all: its result is a new record of that call
        record = Record(record.tool, record.args_hash, event.tool_call_id, record.kind)
    record.turn = None  # it waits no more
    if result_hash is None:
        record.flags = VETO  # another guard's veto: the same trace as this engine's own
    else:
        record.result_hash = result_hash
        record.unknown_tool = facts.unknown_tool_name
        record.flags = _flags(facts)
        record.failure_identity = facts.failure_identity
    if append:
        _record(state, _seen(state), record, cfg.history_size)
    if result_hash is None or state.guard_remaining <= 0:
        return None
    count = guard.observe(state, Triple(record.tool, record.args_hash, result_hash), cfg)
    if not count:
        return None
    abort = Abort(record.tool, count, guard.abort_message(record.tool, count, cfg.window_size))
    if shadow:  # reported once: the guard stands down until the next compaction
        state.guard_remaining = 0
        state.guard_window = []
    else:
        state.aborted = abort
    verdict = _abort_verdict(event, abort, shadow)
    if trace is not None:
        trace.add("guard", verdict, cfg.window_size)
    return verdict


def _trace_result(trace: Trace, signature: str | None, record: Record | None, late: bool, facts: ResultHashes) -> None:
    trace.facts = facts
    trace.args_hash = signature or (record.args_hash if record is not None else None)
    if record is None:
        trace.call = "none"
    else:
        trace.call = "vetoed" if record.flags & VETO else "late" if late else "open"
