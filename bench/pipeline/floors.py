"""Floors: the same messages through (a) a raw aiokafka consume -> produce
relay with no processing, (b) a minimal Faust pass-through agent.

    python -m bench.pipeline.floors --events 200000 [--bootstrap HOST:PORT] [--repeat 3]

The fleet trace (bench/fleet_trace.py, raw payloads, ~610 bytes/event) is
published once to a 12-partition topic; each floor then reads it from the
beginning and republishes every message to its own topic (acks=all and the
worker's default linger: its producer settings). Rate = messages / (first -> last
output record timestamp); CPU = the relay's own user+system seconds. The raw
relay is the ceiling the stream processor is compared to.
"""

from __future__ import annotations

import asyncio
import time

from bench.pipeline import common as c
from bench.pipeline.relay import start_clients


async def raw_relay(bootstrap: str, source: str, destination: str, count: int) -> dict:
    consumer, producer = await start_clients(bootstrap, source)
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        seen = 0
        pending = []
        send = producer.send
        while seen < count:
            batch = await consumer.getmany(timeout_ms=500, max_records=10000)
            for records in batch.values():
                for r in records:
                    pending.append(await send(destination, r.value, key=r.key))
                seen += len(records)
            if len(pending) > 50000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}
    finally:
        await producer.stop()
        await consumer.stop()


def run_once(bootstrap: str, source: str, count: int, partitions: int) -> list[dict]:
    rows = []
    # (a) raw relay
    names = c.topic_names("floor-raw")
    c.create_topics(bootstrap, names, partitions)
    load = c.load_average()
    stats = asyncio.run(raw_relay(bootstrap, source, names["decisions"], count))
    out = asyncio.run(c.collect(bootstrap, names["decisions"], count, timeout=600))
    span, rate = c.span_rate([t for t, _ in out], count)
    rows.append(
        {
            "floor": "raw aiokafka relay",
            "messages": len(out),
            "span_s": span,
            "msgs_per_s": rate,
            "cpu_s": stats["cpu_s"],
            "msgs_per_cpu_s": count / stats["cpu_s"],
            "load1": load,
        }
    )
    # (b) minimal Faust agent
    names = c.topic_names("floor-faust")
    c.create_topics(bootstrap, names, partitions)
    work = c.workdir("floor-faust")
    env = {
        "LW_BROKER": bootstrap,
        "LW_SRC": source,
        "LW_DST": names["decisions"],
        "LW_APP": names["app_id"],
        "LW_DATA": str(work / "data"),
    }
    proc = c.Proc([c.PYTHON, "-m", "bench.pipeline.passthrough_app", "worker", "-l", "warn"], work / "faust.log", env)
    load = c.load_average()
    with proc:
        proc.wait_log("ASSIGNED", 120)
        cpu0 = c.cpu_seconds(proc.pid)
        out = asyncio.run(c.collect(bootstrap, names["decisions"], count, timeout=1200))
        cpu = c.cpu_seconds(proc.pid) - cpu0
    span, rate = c.span_rate([t for t, _ in out], count)
    rows.append(
        {
            "floor": "minimal Faust agent",
            "messages": len(out),
            "span_s": span,
            "msgs_per_s": rate,
            "cpu_s": cpu,
            "msgs_per_cpu_s": count / cpu if cpu else float("nan"),
            "load1": load,
        }
    )
    return rows


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--events", type=int, default=200000)
    args = p.parse_args()
    messages = c.fleet_messages(args.events)
    with c.broker(args.bootstrap) as bootstrap:
        names = c.topic_names("floor-src")
        c.create_topics(bootstrap, names, args.partitions)
        seconds = asyncio.run(c.produce_all(bootstrap, names["events"], messages))
        print(f"published {len(messages):,} events ({sum(len(v) for _, v in messages) / 1e6:.0f} MB) in {seconds:.1f}s")
        runs = [run_once(bootstrap, names["events"], len(messages), args.partitions) for _ in range(args.repeat)]
    rows = []
    for i, name in enumerate(("raw aiokafka relay", "minimal Faust agent")):
        rows.append(
            {
                "floor": name,
                "msgs_per_s": c.median([r[i]["msgs_per_s"] for r in runs]),
                "msgs_per_cpu_s": c.median([r[i]["msgs_per_cpu_s"] for r in runs]),
                "runs": len(runs),
            }
        )
    ratio = rows[1]["msgs_per_s"] / rows[0]["msgs_per_s"]
    print(
        c.table(
            [r for run in runs for r in run],
            ["floor", "messages", "span_s", "msgs_per_s", "cpu_s", "msgs_per_cpu_s", "load1"],
        )
    )
    print()
    print(c.table(rows, ["floor", "msgs_per_s", "msgs_per_cpu_s", "runs"]))
    print(f"\nFaust floor / raw relay = {ratio:.1%}")
    c.record("floors", args, {"events": len(messages), "runs": runs, "median": rows, "faust_over_raw": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
