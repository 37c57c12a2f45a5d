"""What a locally hashing gateway publishes instead of args and outcomes:
the engine's own hashes, and the few args it needs to classify a call.
Tool arguments and outputs then never leave the gateway (docs/CLIENT.md)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from streams.engine.hashing import args_hash as engine_args_hash
from streams.engine.hashing import result_outcome, wire_fields
from streams.engine.stablejson import normalize_payload


def minimal_args(tool: str, args: Any) -> Any:
    """The part of a call's args that the engine needs besides the hash:
    `{"action": …}` for `process` and `message` (it decides whether the call
    polls or sends, and so how its result is hashed); nothing for other tools."""
    if tool in ("process", "message") and isinstance(args, dict) and isinstance(args.get("action"), str):
        return {"action": args["action"]}
    return UNSET


def local_call_fields(tool_name: str, norm_args: Any) -> dict[str, Any]:
    """What a locally hashing gateway publishes of a call's args (normalised
    by `normalize_payload`): the args hash and `minimal_args`."""
    fields: dict[str, Any] = {"args_hash": engine_args_hash(tool_name, norm_args)}
    small = minimal_args(tool_name, norm_args)
    if small is not UNSET:
        fields["args"] = small
    return fields


def local_outcome_fields(tool_name: str, kind: int, result: Any, error: Any) -> dict[str, Any]:
    """What a locally hashing gateway publishes of a call's outcome instead of
    the result or error itself: every field of spec §7.5 the payload gives
    (`kind` is how its call was classified). The OpenClaw plugin computes the
    same fields; tests/vectors/hashing.json pins both."""
    return wire_fields(
        result_outcome(
            tool_name,
            kind,
            normalize_payload(result) if result is not UNSET else UNSET,
            normalize_payload(error) if error is not UNSET else UNSET,
        )
    )
