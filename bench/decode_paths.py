"""Decode paths for one event, compared on the fleet trace: the standard
library's ``json.loads`` to dicts, msgspec to dicts, and the worker's own
``decode_event`` (msgspec into the typed event structs, validated, floats kept
in JavaScript spelling). CPU-time medians of --repeat interleaved passes.

    python -m bench.decode_paths [--trace bench/out/fleet-raw-200000-s1.jsonl] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench.engine_bench import write_record
from bench.fleet_trace import generate_lines
from schemas.codec import decode_event

PATHS: dict[str, Callable[[bytes], Any]] = {
    "json.loads (dicts)": json.loads,
    "msgspec.json.decode (dicts)": msgspec.json.decode,
    "decode_event (typed, validated)": decode_event,
}


def passes(items: list[Any], paths: dict[str, Callable[[Any], Any]], repeat: int) -> dict[str, list[float]]:
    """Items per CPU-second of each path, one pass of each per repetition."""
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeat):
        for name, path in paths.items():
            started = time.process_time()
            for item in items:
                path(item)
            rates[name].append(len(items) / (time.process_time() - started))
    return rates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, help="JSON lines (default: a 50,000-event raw fleet trace, generated)")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    if args.trace:
        lines = args.trace.read_bytes().splitlines()
    else:
        lines = list(generate_lines(1250, 50000, seed=1, hashes="raw"))
    rates = passes(lines, PATHS, args.repeat)
    base = statistics.median(rates["json.loads (dicts)"])
    print(f"{len(lines):,} events, {sum(map(len, lines)) / len(lines):.0f} bytes on average, median of {args.repeat}")
    print(f"{'path':<34} {'events per CPU-s':>16} {'vs json.loads':>14}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<34} {median:>16,.0f} {median / base:>13.2f}x")
    print("record:", write_record("decode-paths", {"events": len(lines), "repeat": args.repeat, "rates": rates}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
