"""Offline replay: events in (JSON lines), verdicts out, no broker needed.

It is the reference for everything downstream: the stream processor must
publish, per run and in order, exactly what this writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import BinaryIO, TextIO

from schemas.codec import BadEvent, append_verdict, decode_event
from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from schemas.state import RunState
from streams.apply import apply_safely

_BLOCK = 1 << 16
"""Output is written in blocks of about this many bytes."""


def replay(
    lines: Iterable[bytes], config: FleetConfig, out: BinaryIO, err: TextIO, policy: FleetPolicy | None = None
) -> int:
    """Write one verdict line per verdict; return how many input lines were refused."""
    states: dict[str, RunState] = {}
    refused = 0
    buffer = bytearray()
    for number, line in enumerate(lines, 1):
        if not line or line.isspace():  # as `not line.strip()`, without copying the line
            continue
        try:
            event = decode_event(line)
            outcome = apply_safely(states.get(event.run_id), event, config, policy)
        except BadEvent as exc:
            refused += 1
            err.write(f"line {number}: {exc}\n")
            continue
        states[event.run_id] = outcome.state
        for verdict in outcome.verdicts:
            append_verdict(buffer, verdict)
        if len(buffer) >= _BLOCK:
            out.write(buffer)
            buffer.clear()
    out.write(buffer)
    out.flush()
    return refused
