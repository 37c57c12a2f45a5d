"""Throughput: the fleet trace pushed as fast as possible through real
``loopwarden worker`` processes (default one), with the raw relay floor
measured in the same run for the ratio.

    python -m bench.pipeline.throughput --events 200000 [--bootstrap HOST:PORT] [--workers 1] \
        [--no-floor] [-- extra worker options, e.g. --linger 10ms]

The trace is published to fresh topics before any worker starts; the
workers start, get their partitions, and the clock runs from the first to
the last verdict record (broker-side timestamps set by the worker's
producer). events/s = trace events / that span; verdicts/s = verdicts /
span. CPU = the workers' user+system seconds over the same interval.
Settings are the worker's defaults, except --standby-replicas 0 (why:
bench/README.md, "Pipeline") and whatever follows ``--``.
"""

from __future__ import annotations

import asyncio
import time

from bench.pipeline import common as c
from bench.pipeline.floors import raw_relay


def run_once(bootstrap: str, messages, expected: int, args) -> dict:  # type: ignore[no-untyped-def]
    names = c.topic_names("tput")
    c.create_topics(bootstrap, names, args.partitions)
    asyncio.run(c.produce_all(bootstrap, names["events"], messages))
    result: dict = {}
    if not args.no_floor:
        floor = c.topic_names("tput-floor")
        c.create_topics(bootstrap, floor, args.partitions)
        asyncio.run(raw_relay(bootstrap, names["events"], floor["decisions"], len(messages)))
        out = asyncio.run(c.collect(bootstrap, floor["decisions"], len(messages), timeout=600))
        result["raw_relay_per_s"] = c.span_rate([t for t, _ in out], len(messages))[1]
    work = c.workdir("tput")
    workers = [
        c.worker(bootstrap, names, work, f"w{i}", args.partitions, args.worker_args) for i in range(args.workers)
    ]
    load = c.load_average()
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_log("event=assigned", 180)
        cpu0 = [c.cpu_seconds(w.pid) for w in workers]
        wall0 = time.monotonic()
        out = asyncio.run(c.collect(bootstrap, names["decisions"], expected, timeout=args.timeout))
        wall = time.monotonic() - wall0
        cpu = sum(c.cpu_seconds(w.pid) - x for w, x in zip(workers, cpu0, strict=True))
        rss = [c.rss_bytes(w.pid) for w in workers]
    finally:
        for w in workers:
            w.stop()
    span, rate = c.span_rate([t for t, _ in out], len(messages))
    result.update(
        {
            "workers": args.workers,
            "events": len(messages),
            "verdicts": len(out),
            "expected_verdicts": expected,
            "span_s": span,
            "events_per_s": rate,
            "verdicts_per_s": len(out) / span if span == span else span,
            "cpu_s": cpu,
            "events_per_cpu_s": len(messages) / cpu if cpu else float("nan"),
            "wall_after_assign_s": wall,
            "rss_mb": [r / 1e6 for r in rss],
            "load1": load,
        }
    )
    if "raw_relay_per_s" in result:
        result["ratio_to_raw"] = rate / result["raw_relay_per_s"]
    return result


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--events", type=int, default=200000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--no-floor", action="store_true", help="skip the raw relay measured in the same run")
    p.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options (after --)")
    args = p.parse_args()
    messages = c.fleet_messages(args.events)
    expected = c.tool_calls(messages)
    rows = []
    with c.broker(args.bootstrap) as bootstrap:
        for _ in range(args.repeat):
            rows.append(run_once(bootstrap, messages, expected, args))
            print(
                c.table(
                    rows[-1:],
                    [
                        "workers",
                        "events",
                        "verdicts",
                        "span_s",
                        "events_per_s",
                        "verdicts_per_s",
                        "raw_relay_per_s",
                        "ratio_to_raw",
                        "events_per_cpu_s",
                        "load1",
                    ],
                ),
                flush=True,
            )
    summary = {
        k: c.median([r[k] for r in rows if k in r])
        for k in ("events_per_s", "verdicts_per_s", "raw_relay_per_s", "ratio_to_raw", "events_per_cpu_s")
    }
    print("\nmedian of", len(rows), "run(s):")
    print(c.table([summary], list(summary)))
    ok = all(r["verdicts"] >= expected for r in rows)
    if not ok:
        print(f"WARNING: fewer verdicts than tool calls ({expected})")
    c.record(
        "throughput" if args.workers == 1 else f"throughput-{args.workers}w",
        args,
        {"runs": rows, "median": summary, "complete": ok},
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
