"""What one checkpoint slice's RocksDB write costs the worker's loop, with
and without RocksDB's write-ahead log.

    python -m bench.state_writes [--states 200] [--state-bytes 4667] [--writes 200] [--repeat 5]

Each write puts ``--states`` run states of ``--state-bytes`` (a full
30-call history is 4,667 bytes) in one WriteBatch into a real run-table
partition (``TableStore``, the worker's store, on a Faust app with no broker):
``unlogged`` is ``TableStore.write_in`` as the worker writes (no write-ahead
log: the changelog topic is the table's log); ``logged`` is the same call
with the database's write options set back to RocksDB's defaults. rocksdict holds the GIL for the whole
write (bench/gil_rocksdict.py), so this is how long the worker's event loop
stands still for a slice. Passes interleave; medians of each pass's median
write are reported, with the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import faust
from rocksdict import WriteOptions

from streams.kafka import clients as kafka_clients
from streams.seams.faust import partition_db
from streams.faustapp.table import UNLOGGED


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--states", type=int, default=200, help="states a write (a slice: WRITES_PER_YIELD)")
    p.add_argument("--state-bytes", type=int, default=4667)
    p.add_argument("--writes", type=int, default=200, help="writes a pass")
    p.add_argument("--repeat", type=int, default=5, help="passes of each")
    args = p.parse_args(argv)
    app = faust.App(
        "state-writes",
        **kafka_clients.faust_connection("localhost", transport="memory"),  # no broker: the store alone
        store="loopwarden://",
        datadir=tempfile.mkdtemp(prefix="lw-sw-"),
    )
    store = app.Table("runs", partitions=1).data
    db = partition_db(store, 0)
    items = [(b"run-%06d" % i, os.urandom(args.state_bytes)) for i in range(args.states * 8)]
    # Both sides are the worker's own write; only the database's write options differ.
    sides = {"unlogged (worker)": UNLOGGED, "logged (RocksDB default)": WriteOptions()}
    medians: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeat):
        for name, options in sides.items():
            db.set_write_options(options)
            times = []
            for n in range(args.writes):
                start = (n % 8) * args.states
                chunk = items[start : start + args.states]
                began = time.perf_counter()
                store.write_in(0, chunk)
                times.append(time.perf_counter() - began)
            medians[name].append(statistics.median(times))
    base = statistics.median(medians["logged (RocksDB default)"])
    print(f"{args.states} states of {args.state_bytes} bytes a write; median of {args.repeat} passes' medians:")
    for name, values in medians.items():
        ms = statistics.median(values) * 1000
        print(f"  {name:26s} {ms:7.3f} ms a write ({ms * 1000 / args.states:6.2f} µs a state), x{ms / 1000 / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
