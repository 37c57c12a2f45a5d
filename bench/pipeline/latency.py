"""Decision latency: a load generator that behaves like gateways, against one
real ``loopwarden worker``.

    python -m bench.pipeline.latency --rates 500,2000,5000 --duration 20 [--bootstrap HOST:PORT] \
        [-- extra worker options]

Many runs in parallel (by default as many runs as calls per second, so each
run makes about one call a second); a run publishes a ``tool_call``, waits
for its verdict on the decision topic, publishes the ``tool_result`` and is
then free for its next call. Calls are started on a fixed schedule (the
offered rate); a call that is due while every run still waits for a verdict
is counted as ``deferred`` and started as soon as a run is free, so a
saturated worker shows as achieved < offered and as latency growing within
the window. Latency = time from just before ``send()`` of the tool_call to
the verdict record arriving at the generator's consumer (both in one
process, one clock): the gateway's whole wait, producer and consumer
included. ``to_worker_send`` splits it: from the gateway's send to the
worker's send of the verdict (the verdict record's create time, set by the
worker's producer; millisecond resolution, same machine clock). The first --warmup seconds of each rate are not counted. Rates run
one after the other against the same worker, each with fresh run ids.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import msgspec

from bench.pipeline import common as c


class _Key(msgspec.Struct):
    run_id: str
    seq: int


_key = msgspec.json.Decoder(_Key)
_enc = msgspec.json.Encoder()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def drive(bootstrap: str, names: dict[str, str], rate: int, duration: float, warmup: float, runs: int) -> dict:
    from aiokafka import TopicPartition

    from streams import kafka_clients

    producer = kafka_clients.aio_producer(bootstrap, acks="all", linger_ms=0)
    consumer = kafka_clients.aio_consumer(
        bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="latest",
        fetch_max_wait_ms=100,
    )
    await producer.start()
    await consumer.start()
    topic_in, topic_out = names["events"], names["decisions"]
    tps = [TopicPartition(topic_out, p) for p in range(c.partition_count(bootstrap, topic_out))]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    tag = f"lat{rate}-{time.time_ns() % 10**8}"
    run_ids = [f"{tag}-{i:06d}" for i in range(runs)]
    seqs = [0] * runs
    idle: deque[int] = deque(range(runs))
    pending: dict[tuple[str, int], tuple[float, int]] = {}
    latencies: list[tuple[float, float]] = []  # (sent at, latency)
    # Gateway send -> the worker's send of the verdict (the record's create
    # time, set by the worker's producer; same machine, same wall clock).
    inbound: list[float] = []
    state = {"issued": 0, "deferred": 0, "answered": 0, "backlog": 0}
    start = time.perf_counter()
    stop_at = start + warmup + duration

    async def call(i: int) -> None:
        seqs[i] += 1
        seq = seqs[i]
        run = run_ids[i]
        event = {
            "type": "tool_call",
            "run_id": run,
            "seq": seq,
            "tool_call_id": f"c{seq}",
            "tool_name": "read",
            "args": {"path": f"src/module{seq}/file{i % 97}.py", "offset": 0, "limit": 2000},
        }
        now = time.perf_counter()
        pending[(run, seq)] = (now, i, time.time())
        await producer.send(topic_in, _enc.encode(event), key=run.encode())

    async def result(i: int, call_seq: int) -> None:
        seqs[i] += 1
        run = run_ids[i]
        event = {
            "type": "tool_result",
            "run_id": run,
            "seq": seqs[i],
            "tool_call_id": f"c{call_seq}",
            "tool_name": "read",
            "result": {"content": [{"type": "text", "text": "x" * 200 + str(call_seq)}]},
        }
        await producer.send(topic_in, _enc.encode(event), key=run.encode())

    async def issuer() -> None:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            due = int((now - start) * rate) - state["issued"]
            while due > 0:
                if idle:
                    await call(idle.popleft())
                    state["issued"] += 1
                    due -= 1
                else:
                    state["deferred"] += due
                    state["issued"] += due  # schedule moves on; the backlog is counted, not replayed
                    break
            await asyncio.sleep(0.001)

    async def listener() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=5000)
            now = time.perf_counter()
            for records in batch.values():
                for r in records:
                    k = _key.decode(r.value)
                    hit = pending.pop((k.run_id, k.seq), None)
                    if hit is None:
                        continue
                    sent, i, sent_wall = hit
                    state["answered"] += 1
                    if sent - start >= warmup:
                        latencies.append((sent - start, now - sent))
                        inbound.append(r.timestamp / 1000 - sent_wall)
                    await result(i, k.seq)
                    idle.append(i)
            if time.perf_counter() >= stop_at and (not pending or time.perf_counter() > stop_at + 15):
                return

    cpu0 = time.process_time()
    listen = asyncio.ensure_future(listener())
    await issuer()
    await listen
    cpu = time.process_time() - cpu0
    await producer.stop()
    await consumer.stop()
    lat = [x for _, x in latencies]
    measured = [s for s, _ in latencies]
    window = duration
    halves = [
        [x for s, x in latencies if s < warmup + window / 2],
        [x for s, x in latencies if s >= warmup + window / 2],
    ]
    return {
        "offered_per_s": rate,
        "runs": runs,
        "achieved_per_s": len(measured) / window,
        "deferred": state["deferred"],
        "unanswered": len(pending),
        "p50_ms": pct(lat, 0.50) * 1000,
        "p95_ms": pct(lat, 0.95) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "max_ms": (max(lat) if lat else float("nan")) * 1000,
        "p50_first_half_ms": pct(halves[0], 0.5) * 1000,
        "p50_second_half_ms": pct(halves[1], 0.5) * 1000,
        "to_worker_send_p50_ms": pct(inbound, 0.50) * 1000,
        "to_worker_send_p99_ms": pct(inbound, 0.99) * 1000,
        "generator_cpu_s": cpu,
    }


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--rates", default="500,2000,5000", help="offered tool calls per second, comma-separated")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per rate (default 20)")
    p.add_argument("--warmup", type=float, default=5.0, help="uncounted seconds per rate (default 5)")
    p.add_argument("--runs", type=int, default=0, help="parallel runs (default: max(200, rate))")
    p.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options (after --)")
    args = p.parse_args()
    rates = [int(x) for x in args.rates.split(",")]
    rows = []
    with c.broker(args.bootstrap) as bootstrap:
        for _ in range(args.repeat):
            names = c.topic_names("lat")
            c.create_topics(bootstrap, names, args.partitions)
            work = c.workdir("lat")
            w = c.worker(bootstrap, names, work, "w0", args.partitions, args.worker_args)
            with w:
                w.wait_log("event=assigned", 180)
                for rate in rates:
                    load = c.load_average()
                    cpu0 = c.cpu_seconds(w.pid)
                    row = asyncio.run(
                        drive(bootstrap, names, rate, args.duration, args.warmup, args.runs or max(200, rate))
                    )
                    row["worker_cpu_s"] = c.cpu_seconds(w.pid) - cpu0
                    row["load1"] = load
                    rows.append(row)
                    print(
                        c.table(
                            [row],
                            [
                                "offered_per_s",
                                "achieved_per_s",
                                "p50_ms",
                                "p95_ms",
                                "p99_ms",
                                "max_ms",
                                "to_worker_send_p50_ms",
                                "to_worker_send_p99_ms",
                                "deferred",
                                "worker_cpu_s",
                                "load1",
                            ],
                        ),
                        flush=True,
                    )
    summary = []
    for rate in rates:
        mine = [r for r in rows if r["offered_per_s"] == rate]
        summary.append(
            {
                "offered_per_s": rate,
                **{
                    k: c.median([r[k] for r in mine])
                    for k in (
                        "achieved_per_s",
                        "p50_ms",
                        "p95_ms",
                        "p99_ms",
                        "max_ms",
                        "p50_first_half_ms",
                        "p50_second_half_ms",
                        "to_worker_send_p50_ms",
                        "to_worker_send_p99_ms",
                    )
                },
                "repeats": len(mine),
            }
        )
    print("\nmedians:")
    print(c.table(summary, list(summary[0])))
    c.record("latency", args, {"runs": rows, "median": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
