"""What a run state's hashes cost as 64-character hex strings (the stored
format) against raw 32-byte digests: the state's size, and the CPU to
encode and decode it, which the worker pays for every run a checkpoint
writes and for every event of a run no longer in flight.

    python -m bench.state_layout [--calls 32] [--repeat 7] [--number 20000]

The state is a real one: ``--calls`` tool calls and their results, shaped
as bench/pipeline/latency.py's generator sends them, applied by the engine.
``digests`` is the same state with each args hash stored as its digest
alone (the ``tool:`` prefix is the record's tool) and each result hash as
its digest, in structs that mirror schemas/state.py's field for field.
``edge conversions`` is what keeping hex in the engine and digests on disk
would add to every encode (hex to bytes) and decode (bytes to hex).
Medians over ``--repeat`` passes of ``--number`` calls each, µs a state;
within a pass the six take turns, so a slower spell of the machine falls on all.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgspec

from bench.pipeline.latency import tool_call, tool_result
from schemas.codec import decode_event, decode_stored, encode_stored
from schemas.config import FleetConfig
from schemas.state import Abort, Block, Latch, Record, RunState, StoredRun
from streams.engine import apply


class DigestRecord(msgspec.Struct, array_like=True, gc=False):
    tool: str
    args_digest: bytes
    call_id: str | None = None
    kind: int = 0
    result_digest: bytes | None = None
    unknown_tool: str | None = None
    flags: int = 0
    failure_identity: str | None = None
    turn: str | None = None


class DigestTriple(msgspec.Struct, array_like=True, gc=False, frozen=True):
    tool: str
    args_digest: bytes
    result_digest: bytes


class DigestState(msgspec.Struct, kw_only=True):
    """RunState's fields, in its order, with digests wherever it holds hashes."""

    last_seq: int = -1
    agent_id: str | None = None
    history: list[DigestRecord] = []
    warning_buckets: dict[str, int] = {}
    guard_remaining: int = 0
    guard_window: list[DigestTriple] = []
    aborted: Abort | None = None
    unfinished: dict[str, DigestRecord] = {}
    tool_calls: int = 0
    escalation: list[bool] = []
    latches: list[Latch] = []
    blocked_turns: dict[str, Block] = {}
    first_blocked_turn: str | None = None


class DigestStored(msgspec.Struct, array_like=True):
    touched: float
    state: DigestState


def real_state(calls: int) -> StoredRun:
    """A run after ``calls`` calls and their results, as the latency benchmark sends them."""
    encode, config = msgspec.json.Encoder().encode, FleetConfig()
    state: RunState | None = None
    for n in range(1, calls + 1):
        call_seq = 2 * n - 1
        for event in (tool_call("run-000001", call_seq, 0, 0.0), tool_result("run-000001", call_seq + 1, call_seq)):
            state = apply(state, decode_event(encode(event)), config).state
    assert state is not None
    return StoredRun(time.time(), state)


def digest(args_hash: str) -> bytes:
    """An args hash (``tool:`` and 64 hex digits) as its digest."""
    return bytes.fromhex(args_hash.partition(":")[2])


def to_digests(record: Record) -> tuple[bytes, bytes | None]:
    result = record.result_hash
    return digest(record.args_hash), None if result is None else bytes.fromhex(result)


def to_hex(record: DigestRecord) -> tuple[str, str | None]:
    result = record.result_digest
    return record.args_digest.hex(), None if result is None else result.hex()


def as_digest_record(r: Record) -> DigestRecord:
    args, result = to_digests(r)
    return DigestRecord(r.tool, args, r.call_id, r.kind, result, r.unknown_tool, r.flags, r.failure_identity, r.turn)


def as_digests(stored: StoredRun) -> DigestStored:
    s = stored.state
    state = DigestState(
        last_seq=s.last_seq,
        agent_id=s.agent_id,
        history=[as_digest_record(r) for r in s.history],
        warning_buckets=s.warning_buckets,
        guard_remaining=s.guard_remaining,
        guard_window=[DigestTriple(t.tool, digest(t.args_hash), bytes.fromhex(t.result_hash)) for t in s.guard_window],
        aborted=s.aborted,
        unfinished={call: as_digest_record(r) for call, r in s.unfinished.items()},
        tool_calls=s.tool_calls,
        escalation=s.escalation,
        latches=s.latches,
        blocked_turns=s.blocked_turns,
        first_blocked_turn=s.first_blocked_turn,
    )
    return DigestStored(stored.touched, state)


def medians(fns: list[Callable[[], object]], number: int, repeat: int) -> list[float]:
    """Median µs a call of each function, over ``repeat`` passes of ``number``
    calls each; the functions take turns within every pass."""
    passes: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, passes, strict=True):
            began = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - began) / number * 1e6)
    return [statistics.median(times) for times in passes]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--number", type=int, default=20000)
    args = p.parse_args(argv)
    hexed = real_state(args.calls)
    digests = as_digests(hexed)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(DigestStored)
    hex_data, digest_data = encode_stored(hexed), encoder.encode(digests)
    hex_records, digest_records = hexed.state.history, digests.state.history
    rows = [
        ("hex (stored format)", len(hex_data), lambda: encode_stored(hexed), lambda: decode_stored(hex_data)),
        ("digests", len(digest_data), lambda: encoder.encode(digests), lambda: decoder.decode(digest_data)),
        (
            "edge conversions",
            None,
            lambda: list(map(to_digests, hex_records)),
            lambda: list(map(to_hex, digest_records)),
        ),
    ]
    print(f"{len(hex_records)} records; µs a state, medians of {args.repeat} passes of {args.number}")
    print(f"{'layout':20} {'bytes':>6} {'encode':>7} {'decode':>7}")
    costs = medians([fn for _, _, encode, decode in rows for fn in (encode, decode)], args.number, args.repeat)
    for i, (name, size, _, _) in enumerate(rows):
        print(f"{name:20} {'' if size is None else size:>6} {costs[2 * i]:7.2f} {costs[2 * i + 1]:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
