"""The rolling-history detectors: four measurements of a run's recent calls and
the eight checks, in order, that turn them into a warning or a block.

Each measurement walks only as far as the pattern it measures reaches, so a
healthy run costs a few steps per call whatever historySize is.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Literal

from msgspec import Struct

from schemas.config import LoopDetectionConfig
from schemas.state import NO_PROGRESS, TERMINAL_FAILURE, VETO, Record
from schemas.verdicts import DetectorName

EXEC = "exec"
STABLE_VARIANT_CALLS = 3
"""Failures of one args variant needed before it counts as a stable churn variant."""


class Detection(Struct, gc=False, frozen=True):
    level: Literal["warning", "critical"]
    detector: DetectorName
    count: int
    message: str
    warning_key: str
    paired_tool_name: str | None = None


class PingPong(Struct, gc=False, frozen=True):
    count: int
    paired_tool: str | None = None
    paired_signature: str | None = None
    no_progress: bool = False


class Streak(Struct, gc=False, frozen=True):
    """A no-progress streak and the result hash it repeats (None when only vetoes counted)."""

    length: int = 0
    result_hash: str | None = None


class Churn(Struct, gc=False, frozen=True):
    """Calls counted by the argument-churn walk, and its stable variants (0 unless it fires)."""

    count: int = 0
    variants: int = 0


_NO_PING_PONG = PingPong(0)
_NO_STREAK = Streak()
_NO_CHURN = Churn()


def unknown_tool_streak(history: list[Record], tool: str) -> tuple[int, str | None]:
    """Newest-first run of calls to `tool` that failed naming the same missing tool.

    A veto of this tool is passed over: blocking the call must not end the
    streak that blocked it (spec §7.4), or the missing tool would run again."""
    count = 0
    name = None
    for record in reversed(history):
        if record.tool != tool:
            break
        if record.flags & VETO:
            continue
        if record.unknown_tool is None:
            break
        if name is None:
            name = record.unknown_tool
        elif record.unknown_tool != name:
            break
        count += 1
    return count, name


def no_progress_streak(same_call: list[Record]) -> Streak:
    """Newest-first run of identical results among records identical to this call
    (spec §7.2). A veto adds to the streak once an older outcome confirms it, or
    on its own when there is no outcome at all: a run that keeps trying a
    blocked call keeps growing its streak."""
    count = pending = 0
    latest = None
    for record in reversed(same_call):
        if record.flags & VETO:
            pending += 1
            continue
        result = record.result_hash
        if result is None:
            continue
        if latest is None:
            latest = result
        elif result != latest:
            break
        count += pending + 1
        pending = 0
    if latest is None:
        return Streak(pending) if pending else _NO_STREAK
    return Streak(count, latest)


def exec_failure_streak(history: list[Record], signature: str) -> Streak:
    """`exec` failing the same way across argument variants (spec §7.2): the
    newest run of terminal failures equal to the newest one by result or by
    failure identity, which ends at any other outcome, at another tool, and
    where the walk comes back to this call's own args after leaving them."""
    count = pending = 0
    reference: Record | None = None
    crossed = False
    for record in reversed(history):
        if record.tool != EXEC:
            break
        flags = record.flags
        if flags & VETO:
            pending += 1
            continue
        result = record.result_hash
        if result is None:
            continue
        if not flags & TERMINAL_FAILURE:
            break
        if reference is None:
            reference = record
            crossed = record.args_hash != signature
        else:
            if record.args_hash != signature:
                crossed = True
            elif crossed:
                break
            identity = record.failure_identity
            if result != reference.result_hash and (identity is None or identity != reference.failure_identity):
                break
        count += pending + 1
        pending = 0
    return _NO_STREAK if reference is None else Streak(count, reference.result_hash)


def argument_churn(history: list[Record], tool: str, signature: str) -> Churn:
    """A tool cycled through a few args variants that all fail the same way
    (spec §7.3): walking newest first over this tool's no-progress outcomes,
    each variant must keep one result; it fires when at least two variants
    have STABLE_VARIANT_CALLS each, they are all the counted calls, they share
    one result, and this call's args are one of them."""
    outcomes: dict[str, tuple[str, int]] = {}
    for record in reversed(history):
        if record.tool != tool:
            break
        result = record.result_hash
        if result is None:
            continue
        if not record.flags & NO_PROGRESS:
            break
        seen = outcomes.get(record.args_hash)
        if seen is None:
            outcomes[record.args_hash] = (result, 1)
        elif seen[0] != result:
            break
        else:
            outcomes[record.args_hash] = (result, seen[1] + 1)
    mine = outcomes.get(signature)
    if mine is None or mine[1] < STABLE_VARIANT_CALLS or len(outcomes) < 2:
        return _NO_CHURN
    count = 0
    for result, calls in outcomes.values():
        if calls < STABLE_VARIANT_CALLS or result != mine[0]:
            return _NO_CHURN
        count += calls
    return Churn(count, len(outcomes))


def ping_pong(history: list[Record], signature: str) -> PingPong:
    """Length of an A, B, A, B … tail that this call would extend, and whether
    both sides kept returning the same result. Vetoes sit in the tail but are
    no evidence either way (spec §7.4): blocking one side must not lift the
    block; each side still needs a real outcome."""
    if not history:
        return _NO_PING_PONG
    last = history[-1]
    last_sig = last.args_hash
    other_sig = None
    for i in range(len(history) - 2, -1, -1):
        if history[i].args_hash != last_sig:
            other_sig = history[i].args_hash
            break
    if other_sig is None or signature != other_sig:
        return _NO_PING_PONG  # the usual case: this call cannot extend an alternation
    tail = 0
    for record in reversed(history):
        if record.args_hash != (last_sig if tail % 2 == 0 else other_sig):
            break
        tail += 1
    if tail < 2:
        return _NO_PING_PONG
    results: dict[str, str] = {}
    no_progress = True
    for record in history[-tail:]:
        if record.flags & VETO:
            continue
        result = record.result_hash
        if result is None or results.setdefault(record.args_hash, result) != result:
            no_progress = False
            break
    return PingPong(tail + 1, last.tool, last_sig, no_progress and len(results) == 2)


def _unusual_streak(tool: str, streak: int, across_args: bool, latest: str | None) -> str:
    """What a streak repeated, for a critical message, when it is not one result
    for identical arguments (then "" and the message says that)."""
    if across_args:
        return f"{tool} failed the same way {streak} times in a row, across argument variants"
    if latest is None:
        return f"{tool} was called {streak} times in a row with identical arguments, each call vetoed"
    return ""


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


class Measures(Struct, gc=False, frozen=True):
    """Everything the detectors measure for a new call, for `loopwarden explain`:
    the same functions `detect` calls, all of them, with nothing cut short."""

    streak: int
    streak_result: str | None
    streak_across_args: bool
    """The `exec` walk across args variants won (it was longer than the per-args one)."""
    same_args_streak: int
    exec_streak: int
    unknown: int
    unknown_name: str | None
    ping_pong: int
    ping_pong_with: str | None
    ping_pong_no_progress: bool
    recent: int
    vetoes: int
    """Veto records among the `recent` records identical to this call."""
    churn: int
    churn_variants: int
    is_poll: bool


def same_call_records(history: list[Record], tool: str, signature: str) -> list[Record]:
    return [r for r in history if r.args_hash == signature and r.tool == tool]


def call_streak(history: list[Record], same_call: list[Record], tool: str, signature: str) -> tuple[Streak, Streak]:
    """The per-args streak, and for `exec` the one across args variants (else none)."""
    same_args = no_progress_streak(same_call) if same_call else _NO_STREAK
    return same_args, exec_failure_streak(history, signature) if tool == EXEC else _NO_STREAK


def measure(history: list[Record], tool: str, signature: str, is_poll: bool) -> Measures:
    same_call = same_call_records(history, tool, signature)
    same_args, across = call_streak(history, same_call, tool, signature)
    across_won = across.length > same_args.length
    streak = across if across_won else same_args
    unknown, unknown_name = unknown_tool_streak(history, tool)
    pp = ping_pong(history, signature)
    churn = argument_churn(history, tool, signature)
    return Measures(
        streak=streak.length,
        streak_result=streak.result_hash,
        streak_across_args=across_won,
        same_args_streak=same_args.length,
        exec_streak=across.length,
        unknown=unknown,
        unknown_name=unknown_name,
        ping_pong=pp.count,
        ping_pong_with=pp.paired_tool,
        ping_pong_no_progress=pp.no_progress,
        recent=len(same_call),
        vetoes=sum(1 for r in same_call if r.flags & VETO),
        churn=churn.count,
        churn_variants=churn.variants,
        is_poll=is_poll,
    )


def detect(
    history: list[Record], tool: str, signature: str, is_poll: bool, cfg: LoopDetectionConfig, seen: Container[str]
) -> Detection | None:
    """The first of the checks (§4 and §7.3) that fires for a new call, or None.

    `seen` holds the args hashes present in `history`. Every threshold is a
    positive integer (`parse_config` enforces it), so check 1 needs the newest
    record to be an unknown-tool failure (or a veto) of this tool, and the
    others need this signature in the window (the streaks, the churn and the
    recent count count its records; an alternation it extends has it as the
    other side), except that an `exec` may fail the same way under other args.
    Most calls meet none of these and return at once.
    """
    if history:
        last = history[-1]
        if last.tool == tool and (last.unknown_tool is not None or last.flags & VETO):
            unknown_count, unknown_name = unknown_tool_streak(history, tool)
            if unknown_count >= cfg.unknown_tool_threshold:
                return Detection(
                    "critical",
                    "unknown_tool_repeat",
                    unknown_count,
                    f"CRITICAL: the unavailable tool {unknown_name} was called {unknown_count} times. "
                    "It does not exist here: stop calling it and carry on without it.",
                    f"unknown-tool:{tool}:{unknown_name}",
                )
    in_window = signature in seen
    if in_window:
        same_call = same_call_records(history, tool, signature)
    elif tool == EXEC and history and history[-1].tool == EXEC:
        same_call = []  # only the walk across args variants can reach a threshold
    else:
        return None
    same_args, across = call_streak(history, same_call, tool, signature)
    if not in_window and across.length < cfg.critical_threshold:
        return None  # below every threshold a streak alone can reach (critical < breaker)
    across_won = across.length > same_args.length
    winner = across if across_won else same_args
    streak, latest = winner.length, winner.result_hash
    if streak >= cfg.global_circuit_breaker_threshold:
        repeated = _unusual_streak(tool, streak, across_won, latest)
        return Detection(
            "critical",
            "global_circuit_breaker",
            streak,
            f"CRITICAL: {repeated or f'{tool} returned the same result {streak} times in a row for identical arguments'}. "
            "The global circuit breaker blocks it; change approach or report the task as failed.",
            f"global:{tool}:{signature}:{latest or 'none'}",
        )

    if is_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return Detection(
                "critical",
                "known_poll_no_progress",
                streak,
                f"CRITICAL: {tool} was polled {streak} times with identical arguments and no progress. "
                "This polling loop is blocked; report the task as stuck or failed.",
                f"poll:{tool}:{signature}:{latest or 'none'}",
            )
        if streak >= cfg.warning_threshold:
            return Detection(
                "warning",
                "known_poll_no_progress",
                streak,
                f"WARNING: {tool} was polled {streak} times with identical arguments and no progress. "
                "Wait longer between checks, or report the task as failed if the process is stuck.",
                f"poll:{tool}:{signature}:{latest or 'none'}",
            )

    if cfg.ping_pong and in_window and len(history) + 1 >= cfg.warning_threshold:
        pp = ping_pong(history, signature)
        if pp.count >= cfg.warning_threshold:
            if pp.paired_signature is not None:
                key = "pingpong:" + "|".join(sorted((signature, pp.paired_signature), key=_utf16))
            else:
                key = f"pingpong:{tool}:{signature}"
            if pp.count >= cfg.critical_threshold and pp.no_progress:
                return Detection(
                    "critical",
                    "ping_pong",
                    pp.count,
                    f"CRITICAL: {pp.count} consecutive calls alternate between {pp.paired_tool} and {tool} "
                    "with no progress. This ping-pong loop is blocked; try a different approach or report the task as failed.",
                    key,
                    pp.paired_tool,
                )
            return Detection(
                "warning",
                "ping_pong",
                pp.count,
                f"WARNING: {pp.count} consecutive calls alternate between {pp.paired_tool} and {tool}. "
                "This looks like a ping-pong loop; stop and report the task as failed if nothing changes.",
                key,
                pp.paired_tool,
            )

    if not is_poll and cfg.generic_repeat and streak >= cfg.critical_threshold:
        repeated = _unusual_streak(tool, streak, across_won, latest)
        return Detection(
            "critical",
            "generic_repeat",
            streak,
            f"CRITICAL: {repeated or f'{tool} was called {streak} times with identical arguments and identical results'}. "
            "This loop is blocked; change the arguments or the approach, or report the task as failed.",
            f"generic:{tool}:{signature}:{latest or 'none'}",
        )

    # Churn counts back from the newest record, which must then be this tool's.
    if cfg.argument_churn and len(same_call) >= STABLE_VARIANT_CALLS and history[-1].tool == tool:
        churn = argument_churn(history, tool, signature)
        if churn.count >= cfg.warning_threshold:
            return Detection(
                "warning",
                "argument_churn",
                churn.count,
                f"WARNING: {tool} has cycled through {churn.variants} argument variants {churn.count} times, "
                "failing the same way each time. Changing the arguments is not making progress; this call is "
                "still allowed, but change approach or report the task as failed.",
                f"argument-churn:{tool}",
            )

    if not is_poll and cfg.generic_repeat:
        recent = len(same_call)
        if recent >= cfg.warning_threshold:
            return Detection(
                "warning",
                "generic_repeat",
                recent,
                f"WARNING: {tool} was called {recent} times with identical arguments. "
                "If this is not making progress, stop retrying and report the task as failed.",
                f"generic:{tool}:{signature}",
            )
    return None
