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
from schemas.state import Record
from schemas.verdicts import DetectorName


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


_NO_PING_PONG = PingPong(0)


def unknown_tool_streak(history: list[Record], tool: str) -> tuple[int, str | None]:
    """Newest-first run of calls to `tool` that failed naming the same missing tool."""
    count = 0
    name = None
    for record in reversed(history):
        if record.tool != tool or record.unknown_tool is None:
            break
        if name is None:
            name = record.unknown_tool
        elif record.unknown_tool != name:
            break
        count += 1
    return count, name


def no_progress_streak(same_call: list[Record]) -> tuple[int, str | None]:
    """Newest-first run of identical results among finished calls identical to this one."""
    count = 0
    latest = None
    for record in reversed(same_call):
        result = record.result_hash
        if result is None:
            continue
        if latest is None:
            latest = result
        elif result != latest:
            break
        count += 1
    return count, latest


def ping_pong(history: list[Record], signature: str) -> PingPong:
    """Length of an A, B, A, B … tail that this call would extend, and whether
    both sides kept returning the same result."""
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
        result = record.result_hash
        if result is None or results.setdefault(record.args_hash, result) != result:
            no_progress = False
            break
    return PingPong(tail + 1, last.tool, last_sig, no_progress and len(results) == 2)


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def detect(
    history: list[Record], tool: str, signature: str, is_poll: bool, cfg: LoopDetectionConfig, seen: Container[str]
) -> Detection | None:
    """The first of the eight checks that fires for a new call, or None.

    `seen` holds the args hashes present in `history`. Every threshold is a
    positive integer (`parse_config` enforces it), so check 1 needs the newest
    record to be an unknown-tool failure of this tool, and checks 2-8 need this
    signature in the window (the streaks and the recent count count its
    records; an alternation it extends has it as the other side). Most calls
    meet neither and return at once.
    """
    if history:
        last = history[-1]
        if last.unknown_tool is not None and last.tool == tool:
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
    if signature not in seen:
        return None
    same_call = [r for r in history if r.args_hash == signature and r.tool == tool]
    streak, latest = no_progress_streak(same_call)
    if streak >= cfg.global_circuit_breaker_threshold:
        return Detection(
            "critical",
            "global_circuit_breaker",
            streak,
            f"CRITICAL: {tool} returned the same result {streak} times in a row for identical arguments. "
            "The global circuit breaker blocks it; change approach or report the task as failed.",
            f"global:{tool}:{signature}:{latest}",
        )

    if is_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return Detection(
                "critical",
                "known_poll_no_progress",
                streak,
                f"CRITICAL: {tool} was polled {streak} times with identical arguments and no progress. "
                "This polling loop is blocked; report the task as stuck or failed.",
                f"poll:{tool}:{signature}:{latest}",
            )
        if streak >= cfg.warning_threshold:
            return Detection(
                "warning",
                "known_poll_no_progress",
                streak,
                f"WARNING: {tool} was polled {streak} times with identical arguments and no progress. "
                "Wait longer between checks, or report the task as failed if the process is stuck.",
                f"poll:{tool}:{signature}:{latest}",
            )

    if cfg.ping_pong and len(history) + 1 >= cfg.warning_threshold:
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

    if not is_poll and cfg.generic_repeat:
        if streak >= cfg.critical_threshold:
            return Detection(
                "critical",
                "generic_repeat",
                streak,
                f"CRITICAL: {tool} was called {streak} times with identical arguments and identical results. "
                "This loop is blocked; change the arguments or the approach, or report the task as failed.",
                f"generic:{tool}:{signature}:{latest}",
            )
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
