"""The post-compaction guard: after a compaction retry, watch the next
`windowSize` finished calls; if all of them are the identical
(tool, args hash, result hash) triple, compaction did not break the loop."""

from __future__ import annotations

from schemas.config import LoopDetectionConfig
from schemas.state import RunState, Triple


def arm(state: RunState, cfg: LoopDetectionConfig) -> int:
    """Arm for `windowSize` attempts; returns that number, or 0 when the guard is off."""
    if not cfg.guard:
        return 0
    state.guard_remaining = cfg.window_size
    state.guard_window = []
    return cfg.window_size


def observe(state: RunState, triple: Triple, cfg: LoopDetectionConfig) -> int:
    """Count of identical triples in the window when they fill it, else 0."""
    if not cfg.guard or state.guard_remaining <= 0:
        return 0
    state.guard_remaining -= 1
    state.guard_window.append(triple)
    matches = state.guard_window.count(triple)
    return matches if matches >= cfg.window_size else 0


def abort_message(tool: str, count: int, window: int) -> str:
    return (
        f"ABORTED (compaction_loop_persisted): after context compaction, {tool} repeated {count} times "
        f"with identical arguments and identical results within {window} attempts, so compaction did "
        "not break the loop. The run is stopped to prevent runaway token use."
    )
