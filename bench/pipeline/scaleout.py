"""Scale-out: 1 vs 2 ``loopwarden worker`` processes on a 12-partition
topic, same trace, same broker, one after the other in one command, with the
raw relay floor measured before each.

    python -m bench.pipeline.scaleout --events 50000 [--bootstrap HOST:PORT] [--repeat 1]

On a 2-core machine the broker, the load and two workers share two cores, so
a second worker can add at most what the first leaves idle; the
events-per-CPU-second column shows whether the work per event changes.
"""

from __future__ import annotations

import argparse

from bench.pipeline import common as c
from bench.pipeline.throughput import run_once


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--events", type=int, default=50000)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options (after --)")
    args = p.parse_args()
    messages = c.fleet_messages(args.events)
    expected = c.tool_calls(messages)
    rows = []
    cols = [
        "workers",
        "events",
        "verdicts",
        "span_s",
        "events_per_s",
        "raw_relay_per_s",
        "ratio_to_raw",
        "events_per_cpu_s",
        "load1",
    ]
    with c.broker(args.bootstrap) as bootstrap:
        for _ in range(args.repeat):
            for n in (1, 2):
                run_args = argparse.Namespace(**{**vars(args), "workers": n, "no_floor": False})
                rows.append(run_once(bootstrap, messages, expected, run_args))
                print(c.table(rows[-1:], cols), flush=True)
    summary = []
    for n in (1, 2):
        mine = [r for r in rows if r["workers"] == n]
        summary.append({"workers": n, **{k: c.median([r[k] for r in mine]) for k in cols[4:8]}})
    print("\nmedians:")
    print(c.table(summary, list(summary[0])))
    print(f"2 workers / 1 worker = {summary[1]['events_per_s'] / summary[0]['events_per_s']:.2f}x")
    c.record("scaleout", args, {"runs": rows, "median": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
