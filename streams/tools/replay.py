"""Offline replay: events in (JSON lines), verdicts out, no broker needed.

It is the reference for everything downstream: the stream processor must
publish, per run and in order, exactly what this writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO, TextIO

from schemas.codec import BadEvent, append_verdict, decode_event
from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from schemas.state import RunState
from schemas.verdicts import Verdict
from streams.engine.entry import apply_safely
from streams.tools.progress import Tally

_BLOCK = 1 << 16
"""Output is written in blocks of about this many bytes."""


class Refusals(Tally):
    """Reports each refused input line on `err`; counts them, the events and
    the verdicts, for the summary line."""

    def __init__(self, err: TextIO) -> None:
        super().__init__()
        self.err = err

    def __call__(self, number: int, exc: BadEvent) -> None:
        self.dead_letters += 1
        self.err.write(f"line {number}: {exc}\n")


def decide(
    lines: Iterable[bytes], config: FleetConfig, refusals: Refusals, policy: FleetPolicy | None = None
) -> Iterator[Verdict]:
    """The verdicts of these events, in the order the engine decides them."""
    states: dict[str, RunState] = {}
    decisions = refusals.decisions
    for number, line in enumerate(lines, 1):
        if not line or line.isspace():  # as `not line.strip()`, without copying the line
            continue
        refusals.events += 1
        try:
            event = decode_event(line)
            outcome = apply_safely(states.get(event.run_id), event, config, policy)
        except BadEvent as exc:
            refusals(number, exc)
            continue
        states[event.run_id] = outcome.state
        for verdict in outcome.verdicts:
            decisions[verdict.decision] += 1
            yield verdict


def replay(
    lines: Iterable[bytes],
    config: FleetConfig,
    out: BinaryIO,
    err: TextIO,
    policy: FleetPolicy | None = None,
    refusals: Refusals | None = None,
) -> int:
    """Write one verdict line per verdict; return how many input lines were
    refused. `refusals`, when given, keeps the counts for a summary."""
    refusals = refusals or Refusals(err)
    buffer = bytearray()
    for verdict in decide(lines, config, refusals, policy):
        append_verdict(buffer, verdict)
        if len(buffer) >= _BLOCK:
            out.write(buffer)
            buffer.clear()
    out.write(buffer)
    out.flush()
    return refusals.dead_letters
