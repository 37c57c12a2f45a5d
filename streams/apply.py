"""The engine's ``apply`` as every reader of events calls it (the worker,
``replay``, ``audit``, ``explain``): a payload that cannot be hashed is a
refused event; any other failure is the engine's and stays an error."""

from __future__ import annotations

from schemas.codec import BadEvent
from schemas.config import FleetConfig
from schemas.events import Event, ToolCall, ToolResult, is_set
from schemas.policy import FleetPolicy
from schemas.state import RunState
from streams.engine import Outcome, apply
from streams.engine.stablejson import python_stable_json

HASH_ERRORS = (RecursionError, ValueError, TypeError)
"""What hashing raises on a payload it cannot serialise."""


def apply_safely(
    state: RunState | None, event: Event, config: FleetConfig, policy: FleetPolicy | None = None
) -> Outcome:
    """`apply`, with an event whose payload cannot be hashed refused as
    ``BadEvent`` (kind ``unhashable``, naming the field)."""
    try:
        return apply(state, event, config, policy)
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
