"""The engine's ``apply`` as every reader of events calls it (the worker,
``replay``, ``audit``, ``explain``): a payload that cannot be hashed, or a seq
that jumps too far above its run's last one, is a refused event; any other
failure is the engine's and stays an error."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from schemas.codec import BadEvent
from schemas.config import FleetConfig
from schemas.configparse import ConfigError
from schemas.events import Event, ToolCall, ToolResult, is_set
from schemas.policy import FleetPolicy
from schemas.state import RunState
from streams.engine import Outcome, apply
from streams.engine.stablejson import python_stable_json

HASH_ERRORS = (RecursionError, ValueError, TypeError)
"""What hashing raises on a payload it cannot serialise."""

MAX_SEQ_JUMP_ENV = "LOOPWARDEN_MAX_SEQ_JUMP"
DEFAULT_MAX_SEQ_JUMP = 10**12
"""How far above its run's last seq an event's seq may be: 10^12, a million
seconds (11.6 days) of microseconds, because the OpenClaw plugin numbers a run
id that comes back from the clock in microseconds. A seq such as 2**63-1 would
otherwise turn every later event of the run into a duplicate."""


def max_seq_jump(environ: Mapping[str, str] = os.environ) -> int:
    """The bound every reader of events applies: ``LOOPWARDEN_MAX_SEQ_JUMP``,
    else the default; ConfigError naming the variable for a value that is not
    a positive integer."""
    text = environ.get(MAX_SEQ_JUMP_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_SEQ_JUMP
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{MAX_SEQ_JUMP_ENV}: expected a positive integer, got {text!r}")
    return value


@functools.cache
def _process_max_seq_jump() -> int:
    return max_seq_jump()


def apply_safely(
    state: RunState | None,
    event: Event,
    config: FleetConfig,
    policy: FleetPolicy | None = None,
    max_jump: int | None = None,
    trace: bool = False,
) -> Outcome:
    """`apply`, with two refusals as ``BadEvent``: an event whose payload
    cannot be hashed (kind ``unhashable``, naming the field), and one whose
    seq is more than ``max_jump`` (default: `max_seq_jump`, read once per
    process) above the last seq of a run that has one (kind ``seq_jump``).
    A run never seen has no last seq, so its first event may carry any seq.
    `trace` is `apply`'s: the decision path comes back with the outcome."""
    if state is not None and state.last_seq >= 0:
        jump = event.seq - state.last_seq
        limit = _process_max_seq_jump() if max_jump is None else max_jump
        if jump > limit:
            raise BadEvent(
                "seq_jump",
                f"seq {event.seq} is {jump} above the run's last seq {state.last_seq} "
                f"(limit {limit}, {MAX_SEQ_JUMP_ENV})",
            )
    try:
        return apply(state, event, config, policy, trace)
    except HASH_ERRORS as exc:
        field = unhashable_field(event)
        if field is None:
            raise  # the payload hashes: the engine itself failed
        raise BadEvent("unhashable", f"cannot hash payload '{field}': {type(exc).__name__}: {exc}") from None


def unhashable_field(event: Event) -> str | None:
    """The first payload field of ``event`` that stable JSON (what the hashes
    are taken of) cannot serialise, or None. Asked only after ``apply`` failed,
    so a healthy event never pays for it."""
    fields: dict[str, object] = {}
    if isinstance(event, (ToolCall, ToolResult)):
        fields["args"] = event.args
    if isinstance(event, ToolResult):
        fields["result"] = event.result
        fields["error"] = event.error
    for name, value in fields.items():
        if not is_set(value):
            continue
        try:
            python_stable_json(value)
        except HASH_ERRORS:
            return name
    return None
