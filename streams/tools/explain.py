"""`loopwarden explain RUN_ID`: one run's timeline, readable in a terminal.

For every event of the run, in order: the call with short hashes, what each
detector measured before the call was decided (no-progress streak, and for
`exec` the one across args variants; unknown-tool streak, ping-pong count,
argument churn, recent count and the veto records among it), the
post-compaction guard's state, and the verdict with its reason: which rule
blocked a call (the detectors, its turn's first block, or a latch), a
recovery that ended the run, and the latches a result released. Events come
from a JSON-lines file (`--events`) or from the events topic (`--bootstrap`); from the topic,
the verdicts that were really published are shown next to the recomputed
ones.

All of it is the engine's own trace of each event (`apply(..., trace=True)`,
`streams.engine.trace`): what it measured and the rules it applied, in
order, as it decided. This module renders it and reconstructs nothing."""

from __future__ import annotations

import collections
import json
import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

import msgspec

from schemas.codec import BadEvent, decode_event, decode_verdict
from schemas.config import FleetConfig, LoopDetectionConfig
from schemas.events import Compaction, ToolCall, ToolResult
from schemas.policy import FleetPolicy, Policy
from schemas.state import (
    KIND_COMMAND_STATUS,
    KIND_OTHER,
    KIND_PROCESS_LOG,
    KIND_PROCESS_POLL,
    KIND_VOLATILE_SEND,
    RunState,
)
from schemas.verdicts import Verdict
from streams.engine.entry import apply_safely
from streams.engine.detectors import Measures
from streams.engine.trace import Step as TraceStep
from streams.engine.trace import Trace
from streams.engine.warnings import BUCKET_SIZE
from streams.kafka.clients import PLAINTEXT, KafkaSecurity

KIND_NAMES = {
    KIND_OTHER: "",
    KIND_PROCESS_POLL: "poll",
    KIND_PROCESS_LOG: "poll(log)",
    KIND_COMMAND_STATUS: "poll",
    KIND_VOLATILE_SEND: "send",
}


def short(hash_value: str | None, width: int = 8) -> str:
    """`exec:3fa2…` -> `3fa2b1c0`; `error:9c1d…` -> `err:9c1d22aa`."""
    if not hash_value:
        return "-"
    head, _, tail = hash_value.rpartition(":")
    if head == "error":
        return "err:" + tail[:width]
    return (tail or head)[:width]


_DIGEST = re.compile(r"[0-9a-f]{64}")


def shorten_key(key: str) -> str:
    """A warning key with its sha256 digests cut to 8 characters."""
    return _DIGEST.sub(lambda m: m.group()[:8] + "…", key)


@dataclass
class Step:
    source: str  # "line 3", "p0@17"
    seq: int
    type: str
    run_id: str
    tool: str | None = None
    call_id: str | None = None
    args_hash: str | None = None
    kind: str = ""
    result_hash: str | None = None
    unknown_tool: str | None = None
    outcome: str = ""
    measures: Measures | None = None
    guard: str = ""
    verdict: Verdict | None = None
    published: list[Verdict] | None = None
    note: str = ""
    agent_id: str | None = None
    config: LoopDetectionConfig | None = None
    history: int = 0
    policy: Policy | None = None
    tool_calls: int = 0
    escalation: list[bool] | None = None
    turn: str | None = None
    pending: int = 0
    """Open calls of this call's turn, counted as vetoes when it was decided (spec §8.1)."""
    latches: list[str] | None = None
    """The warning keys of the run's latches after this event (spec §8.2)."""
    trace: Trace | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "source": self.source,
            "seq": self.seq,
            "type": self.type,
            "tool": self.tool,
            "tool_call_id": self.call_id,
            "args_hash": self.args_hash,
            "kind": self.kind or None,
            "result_hash": self.result_hash,
            "unknown_tool": self.unknown_tool,
            "outcome": self.outcome or None,
            "measures": msgspec.to_builtins(self.measures) if self.measures else None,
            "guard": self.guard,
            "history": self.history,
            "mode": self.policy.mode if self.policy else None,
            "tool_calls": self.tool_calls if self.policy else None,
            "escalation": self.escalation,
            "turn": self.turn,
            "pending": self.pending,
            "latches": self.latches,
            "note": self.note or None,
            "rules": msgspec.to_builtins(self.trace.steps) if self.trace else [],
            "verdict": msgspec.to_builtins(self.verdict) if self.verdict else None,
        }
        if self.published is not None:
            out["published"] = msgspec.to_builtins(self.published)
        return out


def _outcome_text(kind: str | None, no_progress: bool) -> str:
    """The outcome's kind as a result column suffix: veto, terminal failure, no-progress."""
    if kind == "veto":
        return "veto"
    if kind == "terminal_failure":
        return "fail"
    return "np" if no_progress else ""


def _guard_text(state: RunState, cfg: LoopDetectionConfig) -> str:
    if state.aborted is not None:
        return "ABORTED"
    if not cfg.guard:
        return "off"
    if state.guard_remaining > 0:
        return f"armed {state.guard_remaining}/{cfg.window_size}"
    return "idle"


def explain(
    items: Iterable[tuple[str, bytes]], run_id: str, config: FleetConfig, policy: FleetPolicy | None = None
) -> tuple[list[Step], list[str]]:
    """Steps of one run from (source, raw event) pairs; also the refusals.
    Each step renders the engine's trace of its event (`apply(..., trace=True)`)."""
    state: RunState | None = None
    steps: list[Step] = []
    refused: list[str] = []
    for source, raw in items:
        try:
            event = decode_event(raw)
        except BadEvent as exc:
            refused.append(f"{source}: {exc}")
            continue
        if event.run_id != run_id:
            continue
        try:
            outcome = apply_safely(state, event, config, policy, trace=True)
        except BadEvent as exc:
            refused.append(f"{source}: {exc}")
            continue
        trace, state = outcome.trace, outcome.state
        assert trace is not None and state is not None  # asked for; apply always returns a state
        cfg = config.for_agent(trace.agent_id)
        step = Step(source, event.seq, type(event).__struct_config__.tag, run_id, agent_id=trace.agent_id, config=cfg)
        step.policy = None if policy is None else policy.for_agent(trace.agent_id)
        step.trace = trace
        step.verdict = outcome.verdicts[0] if outcome.verdicts else None
        step.args_hash = trace.args_hash
        if isinstance(event, (ToolCall, ToolResult)):
            step.tool = event.tool_name
            step.call_id = event.tool_call_id
        if isinstance(event, ToolCall):
            step.kind = KIND_NAMES.get(trace.kind, "")
            step.turn, step.pending, step.measures = trace.turn, trace.pending, trace.measures
        elif trace.facts is not None:
            facts = trace.facts
            step.result_hash, step.unknown_tool = facts.result_hash, facts.unknown_tool_name
            errored = (facts.result_hash or "").startswith("error:")  # err: says it already
            step.outcome = _outcome_text(facts.outcome_kind, facts.no_progress and not errored)
        if outcome.duplicate:
            step.note = f"duplicate: seq {event.seq} is not above {state.last_seq}; ignored"
        elif isinstance(event, ToolCall):
            step.note = _call_note(trace)
        elif isinstance(event, ToolResult):
            step.note = _result_note(trace)
        elif isinstance(event, Compaction):
            step.note = (
                f"post-compaction guard armed for {trace.armed} attempts"
                if trace.armed
                else ("run already aborted" if trace.aborted else "guard disabled (enabled: false)")
            )
        else:
            step.note = "run ended: history and guard freed"
        step.latches = [latch.block.warning_key or "" for latch in state.latches]
        step.guard = _guard_text(state, cfg)
        step.history = len(state.history)
        if step.policy is not None:
            step.tool_calls = state.tool_calls
            step.escalation = list(state.escalation) if step.policy.escalation else None
        steps.append(step)
    return steps, refused


def _call_note(trace: Trace) -> str:
    """Why a call was answered as it was, from the rules its trace went through."""
    last = trace.steps[-1]
    if last.rule == "aborted":
        return "run already aborted: answered with its abort"
    decided = trace.decided_by
    why = "" if decided is None else _why_blocked(decided, trace.turn)
    if last.decision == "block":
        return f"{why}; recorded as a veto record (adds to this call's no-progress streak)"
    recovery = next((s for s in trace.steps if s.rule == "recovery"), None)
    if recovery is not None and "abort" in (recovery.decision, recovery.shadow_decision):
        first = trace.first_blocked_turn
        where = f"turn {first}" if first else "a call without a turn"
        return (
            f"{why}, and the run's first block was in {where}: the loop came back after its block, "
            "so recovery ends the run (loop_recovery_exhausted)"
        )
    if last.shadow_decision == "block":
        return f"{why} (shadow: it runs)"
    return ""


def _why_blocked(decided: TraceStep, turn: str | None) -> str:
    """Which rule blocked a call: the detectors (which then latch the loop),
    the first block of its turn, or the newest latch that covers it."""
    if decided.rule == "turn":
        return f"blocked by the turn rule: turn {turn} already had a block ({decided.tool}, {decided.detector})"
    if decided.rule == "latch":
        key = shorten_key(decided.warning_key or "")
        return f"blocked by a latch: {decided.detector} on {decided.tool} (key {key})"
    if "block" in (decided.decision, decided.shadow_decision):
        return f"blocked by the detectors ({decided.detector}): the loop is latched until a call that was allowed runs"
    return ""


def _result_note(trace: Trace) -> str:
    """What a result did to the record of its call, and the latches it released."""
    if trace.latches_released:
        n = trace.latches_released
        return f"a call that was allowed ran: {n} latch{'es' * (n > 1)} released"
    facts = trace.facts
    if trace.aborted:
        return "run already aborted: result ignored"
    if facts is not None and facts.outcome_kind == "veto":
        if trace.call == "vetoed":
            return "veto result for a call already vetoed (blocked here): changes nothing"
        if trace.call == "none":
            return "veto result with no open call: appended as a veto record"
        return "veto result: its call is recorded as a veto record"
    if facts is None or facts.result_hash is None:
        return "no result hash (no outcome): not progress"
    return {
        "none": "no open call with this id: appended as a new record",
        "vetoed": "result for a vetoed call: appended as a new record of that call",
        "late": "its call had left the history unfinished: appended with the call's args hash",
    }.get(trace.call or "", "")


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def events_from_file(path: str) -> Iterable[tuple[str, bytes]]:
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for number, line in enumerate(stream, 1):
            if line.strip():
                yield f"line {number}", line
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def from_topics(
    bootstrap: str,
    run_id: str,
    events_topic: str,
    decisions_topic: str,
    security: KafkaSecurity = PLAINTEXT,
    since_ms: int | None = None,
) -> tuple[list[tuple[str, bytes]], dict[int, list[Verdict]]]:
    """The run's events (by message key) and its published verdicts, read
    by manual assignment without a consumer group; from the records of
    `since_ms` on (None: from the start of the topics)."""
    from streams.kafka.reader import TopicReader

    key = run_id.encode()
    with TopicReader(bootstrap, "loopwarden-explain", security) as reader:
        tps = reader.partitions(events_topic)
        events = [
            (f"p{r.partition}@{r.offset}", r.value)
            for r in reader.read(reader.starts(tps, since_ms), reader.ends(tps), key)
        ]
        published: dict[int, list[Verdict]] = {}
        try:
            d_tps = reader.partitions(decisions_topic)
        except Exception:
            return events, published
        for record in reader.read(reader.starts(d_tps, since_ms), reader.ends(d_tps), key):
            try:
                verdict = decode_verdict(record.value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            seen = published.setdefault(verdict.seq, [])
            if verdict not in seen:
                seen.append(verdict)
        return events, published


def topic_ends(bootstrap: str, topics: list[str], security: KafkaSecurity = PLAINTEXT) -> dict[str, list[int]]:
    """The end offset of each partition of those `topics` that exist: a cheap
    question that says whether a timeline read before is still whole."""
    from streams.kafka.reader import ReadError, TopicReader

    ends: dict[str, list[int]] = {}
    with TopicReader(bootstrap, "loopwarden-explain", security) as reader:
        for topic in topics:
            try:
                tps = reader.partitions(topic)
            except ReadError:
                continue
            offsets = reader.ends(tps)
            ends[topic] = [offsets[tp] for tp in tps]
    return ends


def explain_from_topics(
    bootstrap: str,
    run_id: str,
    events_topic: str,
    decisions_topic: str,
    config: FleetConfig,
    policy: FleetPolicy | None = None,
    security: KafkaSecurity = PLAINTEXT,
    since_ms: int | None = None,
) -> tuple[list[Step], list[str]]:
    """The run's steps from the topics (from `since_ms` on), each with the verdicts really published for it."""
    items, published = from_topics(bootstrap, run_id, events_topic, decisions_topic, security, since_ms)
    steps, refused = explain(items, run_id, config, policy)
    for step in steps:
        step.published = published.get(step.seq, [])
    return steps, refused


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------


def _config_line(cfg: LoopDetectionConfig) -> str:
    if cfg.rolling:
        detectors = [
            name
            for name, on in (
                ("genericRepeat", cfg.generic_repeat),
                ("knownPollNoProgress", cfg.known_poll_no_progress),
                ("pingPong", cfg.ping_pong),
                ("argumentChurn", cfg.argument_churn),
            )
            if on
        ]
        rolling = (
            f"rolling detectors on (warn {cfg.warning_threshold}, critical {cfg.critical_threshold}, "
            f"unknown tool {cfg.unknown_tool_threshold}, breaker {cfg.global_circuit_breaker_threshold}, "
            f"history {cfg.history_size}; {', '.join(detectors) or 'no pattern detectors'})"
        )
    else:
        rolling = "rolling detectors off (enabled is not true)"
    guard = f"guard window {cfg.window_size}" if cfg.guard else "guard off"
    return f"{rolling}; {guard}"


def _measures_text(m: Measures | None) -> str:
    if m is None:
        return ""
    np = f"np {m.streak}"
    if m.streak:
        np += ("~" if m.streak_across_args else "=") + (short(m.streak_result, 6) if m.streak_result else "veto")
    parts = [np, f"unk {m.unknown}" + (f"({m.unknown_name})" if m.unknown else "")]
    pp = f"pp {m.ping_pong}"
    if m.ping_pong:
        pp += f"<>{m.ping_pong_with}" + ("!" if m.ping_pong_no_progress else "")
    parts.append(pp)
    if m.churn:
        parts.append(f"churn {m.churn}/{m.churn_variants}v")
    parts.append(f"rec {m.recent}" + (f"({m.vetoes}v)" if m.vetoes else ""))
    return " ".join(parts)


def _verdict_text(v: Verdict | None) -> str:
    if v is None:
        return ""
    if v.decision == "allow" and v.detector is None:
        return "allow"
    text = v.decision.upper() if v.decision != "allow" else "allow"
    if v.shadow_decision:
        text += f" [shadow: {v.shadow_decision.upper()}]"
    text += f" {v.detector} ({v.level}, count {v.count})"
    return text


def _policy_line(p: Policy) -> str:
    budget = f"budget {p.max_tool_calls} tool calls" if p.max_tool_calls else "no budget"
    escalation = (
        f"escalation at {p.blocked_calls} blocked of the last {p.window} calls" if p.escalation else "escalation off"
    )
    return f"mode {p.mode}; recovery {'on' if p.recovery else 'off'}; {budget}; {escalation}"


def _policy_state(s: Step) -> str:
    """The run's call count against its budget and its escalation memory (X blocked, . not)."""
    p = s.policy
    if p is None or s.type != "tool_call":
        return ""
    text = f"call {s.tool_calls}" + (f"/{p.max_tool_calls}" if p.max_tool_calls else "")
    if s.escalation is not None:
        text += " escalation [" + "".join("X" if b else "." for b in s.escalation) + "]"
    return text


def _result_text(s: Step) -> str:
    """A step's result column: short hash, outcome, the missing tool it names."""
    result = short(s.result_hash) if s.type == "tool_result" and s.outcome != "veto" else ""
    if s.outcome:
        result = f"{result} {s.outcome}".strip()
    if s.unknown_tool:
        result += f" ?{s.unknown_tool}"
    return result


def format_timeline(
    steps: list[Step], run_id: str, refused: list[str], *, width: int = 100, show_published: bool = False
) -> str:
    if not steps:
        lines = [f"run {run_id}: no events found"]
        lines += [f"  refused {r}" for r in refused]
        return "\n".join(lines) + "\n"
    first = steps[0]
    agents = {s.agent_id for s in steps if s.agent_id}
    seq_width = max(5, *(len(str(s.seq)) for s in steps))  # gateways that seed seq from a clock
    lines = [
        f"run {run_id}: {len(steps)} events, agent {', '.join(sorted(agents)) or '(none: global config)'}",
        f"  config: {_config_line(steps[-1].config or first.config or LoopDetectionConfig())}",
        f"  policy: {_policy_line(steps[-1].policy) if steps[-1].policy else 'none (enforce; recovery on; no budget; no escalation)'}",
        "  measures (before each call): np = no-progress streak (=result, ~result: exec failing the same way",
        "  across args variants, =veto: vetoes alone), unk = unknown-tool streak, pp = ping-pong count (<>paired",
        "  tool, ! = no-progress evidence), churn = argument churn count/variants, rec = recent identical calls",
        "  (Nv: N of them veto records); results: veto, fail = terminal exec failure, np = unchanged write",
    ]
    wrap = textwrap.TextWrapper(width=width, initial_indent=" " * 13, subsequent_indent=" " * 13)
    # Long results and measures (a missing tool's name, a long streak) widen
    # their column rather than push the verdict out of line.
    results = [_result_text(s) for s in steps]
    measures = [_measures_text(s.measures) for s in steps]
    result_width = max(12, *map(len, results))
    measures_width = max(40, *map(len, measures))
    lines += [
        "",
        f"{'seq':>{seq_width}}  {'event':<11} {'tool':<16} {'args':<8} {'result':<{result_width}}"
        f" {'measures':<{measures_width}} {'guard':<10} verdict",
    ]
    for s, result, measured in zip(steps, results, measures, strict=True):
        tool = (s.tool or "")[:16]
        args = short(s.args_hash) if s.args_hash else ""
        verdict = _verdict_text(s.verdict)
        if s.kind:
            tool = f"{tool[: 15 - len(s.kind)]}[{s.kind}]" if len(tool) + len(s.kind) + 2 > 16 else f"{tool}[{s.kind}]"
        lines.append(
            f"{s.seq:>{seq_width}}  {s.type:<11} {tool:<16} {args:<8} {result:<{result_width}}"
            f" {measured:<{measures_width}} {s.guard:<10} {verdict}".rstrip()
        )
        if s.turn is not None:
            pending = f", {s.pending} open call{'s' * (s.pending != 1)} of it counted as vetoes" if s.pending else ""
            lines.append(" " * 13 + f"turn {s.turn}{pending}")
        if s.note:
            lines.extend(wrap.wrap(s.note))
        if _policy_state(s):
            lines.append(" " * 13 + "policy: " + _policy_state(s))
        v = s.verdict
        if v is not None and v.detector is not None:
            if v.decision == "allow" and v.shadow_decision is None:
                next_at = (v.count // BUCKET_SIZE + 1) * BUCKET_SIZE
                lines.append(
                    " " * 13 + f"warning not repeated (already delivered for key {shorten_key(v.warning_key or '')};"
                    f" next at count {next_at})"
                )
            else:
                if v.warning_key:
                    lines.append(" " * 13 + f"key {shorten_key(v.warning_key)}")
                if v.message:
                    lines.extend(wrap.wrap(v.message))
        if show_published and s.verdict is not None:
            got = s.published or []
            if not got:
                lines.append(" " * 13 + "published: NOTHING (no verdict on the decision topic)")
            elif len(got) == 1 and got[0] == s.verdict:
                pass
            else:
                lines.append(" " * 13 + "published: DIFFERENT: " + " | ".join(_verdict_text(g) for g in got))
    blocked = sum(1 for s in steps if s.verdict and s.verdict.decision == "block")
    warned = sum(1 for s in steps if s.verdict and s.verdict.decision == "warn")
    aborted = any(s.verdict and s.verdict.decision == "abort" for s in steps)
    calls = sum(1 for s in steps if s.type == "tool_call")
    lines.append("")
    lines.append(f"summary: {calls} calls, {warned} warned, {blocked} blocked" + (", run ABORTED" if aborted else ""))
    if steps[-1].latches:
        lines.append("latched at the end: " + ", ".join(shorten_key(key) for key in steps[-1].latches))
    shadow = collections.Counter(s.verdict.shadow_decision for s in steps if s.verdict and s.verdict.shadow_decision)
    if shadow:
        lines.append(
            "shadow mode: enforcing would have "
            + ", ".join(f"{d}ed {shadow[d]}" for d in ("warn", "block", "abort") if shadow[d])
        )
    if show_published:
        with_verdict = [s for s in steps if s.verdict is not None]
        same = sum(1 for s in with_verdict if s.published and len(s.published) == 1 and s.published[0] == s.verdict)
        lines.append(
            f"published on the decision topic: {same} of {len(with_verdict)} verdicts identical to the recomputed ones"
        )
    for r in refused:
        lines.append(f"  refused {r}")
    return "\n".join(lines) + "\n"


def main(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The `loopwarden explain` command (argparse namespace from streams.cli)."""
    from schemas.configfile import load_for_cli

    out = out or sys.stdout
    err = err or sys.stderr
    config, policy = load_for_cli(args.config, args.policy, err)
    from_file = bool(args.events)
    if from_file:
        try:
            items = list(events_from_file(args.events))
        except OSError as exc:
            print(f"loopwarden: cannot read events: {exc}", file=err)
            return 2
        steps, refused = explain(items, args.run_id, config, policy)
    else:
        from streams.kafka.reader import ReadError, kafka_refusals
        from streams.kafka.options import connection_from_args

        bootstrap, security = connection_from_args(args)
        try:
            with kafka_refusals():
                steps, refused = explain_from_topics(
                    bootstrap, args.run_id, args.events_topic, args.decisions_topic, config, policy, security
                )
        except ReadError as exc:
            print(f"loopwarden: {exc}", file=err)
            return 2
    if args.json:
        for step in steps:
            out.write(json.dumps(step.to_json()) + "\n")
    else:
        out.write(format_timeline(steps, args.run_id, refused, show_published=not from_file))
    return 0 if steps else 1
