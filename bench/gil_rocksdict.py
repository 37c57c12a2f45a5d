"""Does rocksdict let other Python threads run while it writes?

    python -m bench.gil_rocksdict [--seconds 2] [--value-bytes 2000] [--repeat 5]

The main thread counts loop turns for ``--seconds`` while a second thread
does one of: nothing; RocksDB puts of ``--value-bytes`` values (rocksdict,
WAL on, the run table's write options); single puts gathered in a
WriteBatch; pure-Python work (a thread that holds the GIL all the time).
If a put released the GIL for the write, the main thread would keep close to
its turns with nothing beside it; if it holds the GIL, the main thread gets
what a GIL-bound thread leaves it. Passes interleave; medians are reported,
with the writer's puts per second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from rocksdict import Options, Rdict, WriteBatch


def spin(stop: threading.Event) -> int:
    turns = 0
    while not stop.is_set():
        turns += 1
    return turns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--value-bytes", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    db = Rdict(tempfile.mkdtemp(prefix="lw-gil-"), Options())
    value = os.urandom(args.value_bytes)
    writes = [0]

    def puts(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            db.put(b"run-%08d" % (i % 50000), value)
            i += 1
        writes[0] = i

    def batches(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            batch = WriteBatch()
            for _ in range(200):
                batch.put(b"run-%08d" % (i % 50000), value)
                i += 1
            db.write(batch)
        writes[0] = i

    def python(stop: threading.Event) -> None:
        spin(stop)

    sides: dict[str, Callable[[threading.Event], None] | None] = {
        "nothing beside": None,
        "rocksdict put": puts,
        "rocksdict WriteBatch of 200": batches,
        "pure Python (holds the GIL)": python,
    }
    turns: dict[str, list[float]] = {name: [] for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeat):
        for name, work in sides.items():
            stop = threading.Event()
            writes[0] = 0
            thread = threading.Thread(target=work, args=(stop,)) if work else None
            if thread:
                thread.start()
            timer = threading.Timer(args.seconds, stop.set)
            started = time.perf_counter()
            timer.start()
            n = spin(stop)
            elapsed = time.perf_counter() - started
            if thread:
                thread.join()
            turns[name].append(n / elapsed)
            rates[name].append(writes[0] / elapsed)
    alone = statistics.median(turns["nothing beside"])
    print(f"{'beside the main thread':32} {'main thread turns/s':>20} {'share of alone':>15} {'puts/s':>10}")
    for name in sides:
        t = statistics.median(turns[name])
        print(f"{name:32} {t:>20,.0f} {t / alone:>15.2f} {statistics.median(rates[name]):>10,.0f}")
    db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
