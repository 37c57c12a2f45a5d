"""Stable JSON and its sha256 for the payloads of the fleet trace, the C
speed-ups (streams/engine/_speedups.c) against the pure-Python definition:
every call's args and every result object, decoded as the engine decodes them.
CPU-time medians of --repeat interleaved passes, in µs per payload.

    python -m bench.hash_paths [--trace bench/out/fleet-raw-200000-s1.jsonl] [--repeat 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
from pathlib import Path

from bench.decode_paths import passes
from bench.engine_bench import write_record
from bench.fleet_trace import generate_lines
from schemas.events import ToolCall, ToolResult
from schemas.codec import decode_event
from streams.engine import _speedups
from streams.engine.hashing import python_digest
from streams.engine.stablejson import python_stable_json

PATHS = {
    "stable_json, Python": python_stable_json,
    "stable_json, C": _speedups.stable_json,
    "sha256 hex, Python": python_digest,
    "sha256 hex, C": _speedups.stable_digest,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, help="JSON lines (default: a 50,000-event raw fleet trace, generated)")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    lines = args.trace.read_bytes().splitlines() if args.trace else list(generate_lines(1250, 50000, 1, "raw"))
    events = [decode_event(line) for line in lines]
    payloads = {
        "call args": [e.args for e in events if type(e) is ToolCall],
        "result objects": [e.result for e in events if type(e) is ToolResult and isinstance(e.result, dict)],
    }
    gc.freeze()  # the decoded trace is not the code under test
    record = {}
    print(f"{'payload':<15} {'path':<22} {'µs each':>8} {'Python/C':>9}")
    for kind, values in payloads.items():
        rates = passes(values, PATHS, args.repeat)
        micros = {name: 1e6 / statistics.median(r) for name, r in rates.items()}
        record[kind] = {"count": len(values), "rates": rates}
        for name, us in micros.items():
            python = micros[name.replace(", C", ", Python")]
            ratio = f"{python / us:8.2f}x" if name.endswith(", C") else ""
            print(f"{kind:<15} {name:<22} {us:>8.2f} {ratio:>9}")
    print("record:", write_record("hash-paths", {"repeat": args.repeat, "payloads": record}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
