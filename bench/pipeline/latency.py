"""Decision latency: a load generator that behaves like gateways, against real
``loopwarden worker`` processes and, in the same run, the bare aiokafka relay
(bench/pipeline/relay.py), the two-hop floor; rounds interleaved.

    python -m bench.pipeline.latency --rates 500,2000 --duration 20 --warmup 5 --repeat 3 \
        [--bootstrap HOST:PORT [--broker-pid PID --side-cpus CPUS]] [--no-relay] \
        [--variant 'LABEL=OPTIONS' ...] [-- options of every worker]

Sides. ``relay`` forwards each tool call unchanged to its own decision topic
(the generator reads run_id and seq from it as from a verdict); ``worker``
is one worker with the defaults plus whatever follows ``--``; each
``--variant LABEL=OPTIONS`` adds a worker with those options as well (words
of the form NAME=VALUE set an environment variable of that worker instead).
Every side has its own fresh topics and process, started before the first
round and kept to the end. A round drives every side at every rate, one
after the other; the order of the sides turns by one each round, so no side
always runs after the same one. Summaries are medians over rounds, and the
ratio to the relay is taken from the medians of the same run.

Load. Many runs in parallel (by default as many runs as calls per second,
so each run makes about one call a second); a run publishes a
``tool_call``, waits for its verdict, publishes the ``tool_result`` and is
then free for its next call. Calls are started on a fixed schedule (the
offered rate); a call that is due while every run still waits is counted as
``deferred`` and started as soon as a run is free, so a saturated side shows
as achieved < offered. The first --warmup seconds of each drive are not
counted.

Clocks. Latency is the generator's ``perf_counter`` from just before the
tool call's ``send()`` to the poll that returned its verdict: the gateway's
whole wait. The tool call carries ``ts`` (``time.time()`` at publish, as the
OpenClaw plugin stamps it). Two more clocks split the wait into stages:

* the broker's: every topic of the run stamps records with their append time
  (``LogAppendTime``; whole milliseconds, so each stage is within 1 ms):
  ``publish→in`` (ts to the tool call's append, from the producer's
  acknowledgement), ``in→out`` (the tool call's append to the verdict's: the
  side's own hop), ``out→seen`` (the verdict's append to the generator's poll);
* the worker's own (``--trace-stages``, streams/worker/stages.py, wall clock
  in microseconds): ``publish→fetched`` (ts to the worker's consumer handing
  the batch to the processor on the event loop; split at the tool call's
  append and at the moment the worker's poll of aiokafka returned it into
  ``publish→in``, ``in→polled``, the fetch, and ``polled→fetched``, Faust's
  per-record bookkeeping before the batch is handed over), ``fetched→sent`` (to the producer accepting the verdict;
  split into ``fetched→taken``, waiting for the processor, and
  ``taken→sent``), ``sent→acked`` (to the broker's acknowledgement reaching
  the worker's loop; split at the verdict's append into ``sent→out``,
  linger and request, and ``out→acked``, the response), ``acked→seen`` (to
  the generator's poll).

Cores. By default every process shares every core, as on a small host.
``--side-cpus CPUS`` (with ``--bootstrap`` and ``--broker-pid``) gives the
sides those cores and the generator and the broker the others: each side is
then measured with cores of its own (the others idle between their drives),
which tells CPU contention apart from the side's own waits. With
``--broker-pid`` alone, each drive also reports the broker's CPU-s: what
the side made the broker do, on the cores the side shares with it.

Each stage is given as the median over rounds of its p50 and its p99, and,
under ``tail``, the median over rounds of its median among the slowest 1 %
of calls (latency at or above the p99): where the tail's time goes.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from bench.pipeline import common as c
from bench.stats import percentile

RELAY = "relay"
WORKER = "worker"
CALL_PREFIX = '{"type":"tool_call"'


class _Key(msgspec.Struct):
    run_id: str
    seq: int


_key = msgspec.json.Decoder(_Key)
_enc = msgspec.json.Encoder()


class Sample(NamedTuple):
    """One counted call: the generator's and the broker's clocks."""

    run_id: str
    seq: int
    published: float  # time.time() = the event's ts
    appended_in: float  # the tool call's LogAppendTime, seconds
    appended_out: float  # the verdict's LogAppendTime, seconds
    seen: float  # time.time() at the poll that returned the verdict
    latency: float  # perf_counter seconds, send to poll


class Trace(NamedTuple):
    """One verdict's clocks in the worker (streams/worker/stages.py)."""

    run_id: str
    seq: int
    ts: float | None
    polled: float
    fetched: float
    taken: float
    sent: float
    acked: float


Stage = Callable[[Sample, Trace | None], float | None]

BROKER_STAGES: dict[str, Stage] = {
    "publish→in": lambda s, w: s.appended_in - s.published,
    "in→out": lambda s, w: s.appended_out - s.appended_in,
    "out→seen": lambda s, w: s.seen - s.appended_out,
}
WORKER_STAGES: dict[str, Stage] = {
    "publish→fetched": lambda s, w: None if w is None else w.fetched - s.published,
    "  in→polled": lambda s, w: None if w is None else w.polled - s.appended_in,
    "  polled→fetched": lambda s, w: None if w is None else w.fetched - w.polled,
    "fetched→sent": lambda s, w: None if w is None else w.sent - w.fetched,
    "  fetched→taken": lambda s, w: None if w is None else w.taken - w.fetched,
    "  taken→sent": lambda s, w: None if w is None else w.sent - w.taken,
    "sent→acked": lambda s, w: None if w is None else w.acked - w.sent,
    "  sent→out": lambda s, w: None if w is None else s.appended_out - w.sent,
    "  out→acked": lambda s, w: None if w is None else w.acked - s.appended_out,
    "acked→seen": lambda s, w: None if w is None else s.seen - w.acked,
}


def breakdown(samples: Sequence[Sample], traces: dict[tuple[str, int], Trace]) -> dict[str, dict[str, float]]:
    """Per stage, in ms: p50, p99, and the median among the calls whose
    latency is at or above the p99 (``tail``). Worker stages only when
    ``traces`` has the calls."""
    cut = percentile([s.latency for s in samples], 0.99)
    stages = dict(BROKER_STAGES)
    if any((s.run_id, s.seq) in traces for s in samples):
        stages.update(WORKER_STAGES)
    out = {}
    for name, stage in stages.items():
        values, tail = [], []
        for s in samples:
            v = stage(s, traces.get((s.run_id, s.seq)))
            if v is None:
                continue
            values.append(v * 1000)
            if s.latency >= cut:
                tail.append(v * 1000)
        out[name] = {
            "p50": percentile(values, 0.5),
            "p99": percentile(values, 0.99),
            "tail": percentile(tail, 0.5),
            "n": len(values),
        }
    return out


def read_traces(path: Path) -> dict[tuple[str, int], Trace]:
    if not path.exists():
        return {}
    decode = msgspec.json.Decoder(Trace).decode
    rows = (decode(line) for line in path.read_bytes().splitlines() if line)
    return {(t.run_id, t.seq): t for t in rows}


def tool_call(run: str, seq: int, i: int, ts: float) -> dict[str, Any]:
    """Run ``i``'s tool call number ``seq``, as a gateway publishes it (``ts``: when)."""
    return {
        "type": "tool_call",
        "run_id": run,
        "seq": seq,
        "tool_call_id": f"c{seq}",
        "tool_name": "read",
        "args": {"path": f"src/module{seq}/file{i % 97}.py", "offset": 0, "limit": 2000},
        "ts": ts,
    }


def tool_result(run: str, seq: int, call_seq: int) -> dict[str, Any]:
    """The result, as event ``seq`` of its run, of the tool call ``call_seq``."""
    return {
        "type": "tool_result",
        "run_id": run,
        "seq": seq,
        "tool_call_id": f"c{call_seq}",
        "tool_name": "read",
        "result": {"content": [{"type": "text", "text": "x" * 200 + str(call_seq)}]},
    }


async def drive(
    bootstrap: str, topic_in: str, topic_out: str, rate: int, duration: float, warmup: float, runs: int
) -> tuple[dict[str, Any], list[Sample]]:
    from aiokafka import TopicPartition

    from streams.kafka import clients as kafka_clients

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
    tps = [TopicPartition(topic_out, p) for p in range(c.partition_count(bootstrap, topic_out))]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    tag = f"lat{rate}-{time.time_ns() % 10**8}"
    run_ids = [f"{tag}-{i:06d}" for i in range(runs)]
    seqs = [0] * runs
    idle: deque[int] = deque(range(runs))
    pending: dict[tuple[str, int], tuple[float, int, float]] = {}
    appended: dict[tuple[str, int], float] = {}  # the tool call's broker append time
    samples: list[Sample] = []
    state = {"issued": 0, "deferred": 0, "answered": 0}
    start = time.perf_counter()
    stop_at = start + warmup + duration

    async def call(i: int) -> None:
        seqs[i] += 1
        seq = seqs[i]
        run = run_ids[i]
        now, wall = time.perf_counter(), time.time()
        pending[(run, seq)] = (now, i, wall)
        sent = await producer.send(topic_in, _enc.encode(tool_call(run, seq, i, wall)), key=run.encode())
        sent.add_done_callback(lambda f, k=(run, seq): appended.__setitem__(k, f.result().timestamp / 1000))

    async def result(i: int, call_seq: int) -> None:
        seqs[i] += 1
        run = run_ids[i]
        await producer.send(topic_in, _enc.encode(tool_result(run, seqs[i], call_seq)), key=run.encode())

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
            now, wall = time.perf_counter(), time.time()
            for records in batch.values():
                for r in records:
                    k = _key.decode(r.value)
                    key = (k.run_id, k.seq)
                    hit = pending.pop(key, None)
                    if hit is None:
                        continue
                    sent, i, published = hit
                    state["answered"] += 1
                    if sent - start >= warmup:
                        samples.append(
                            Sample(
                                k.run_id, k.seq, published, appended.get(key, 0.0), r.timestamp / 1000, wall, now - sent
                            )
                        )
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
    samples = [s._replace(appended_in=appended[(s.run_id, s.seq)]) for s in samples if (s.run_id, s.seq) in appended]
    lat = [s.latency for s in samples]
    return {
        "offered_per_s": rate,
        "runs": runs,
        "achieved_per_s": len(samples) / duration,
        "deferred": state["deferred"],
        "unanswered": len(pending),
        "p50_ms": percentile(lat, 0.50) * 1000,
        "p95_ms": percentile(lat, 0.95) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "max_ms": (max(lat) if lat else float("nan")) * 1000,
        "generator_cpu_s": cpu,
    }, samples


@dataclass
class Side:
    """A relay or a worker, its topics and process, kept for the whole run."""

    label: str
    names: dict[str, str]
    proc: c.Proc
    trace: Path | None = None
    samples: dict[tuple[int, int], list[Sample]] = field(default_factory=dict)  # (round, rate) -> samples


def variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    """``LABEL=OPTIONS`` -> (label, worker options, environment)."""
    label, sep, rest = text.partition("=")
    if not sep or not label or label in (RELAY, WORKER):
        raise SystemExit(f"--variant {text!r}: expected LABEL=OPTIONS, LABEL not {RELAY!r} or {WORKER!r}")
    options, env = [], {}
    for word in shlex.split(rest):
        name, eq, value = word.partition("=")
        if eq and name.isidentifier() and name.isupper():
            env[name] = value
        else:
            options.append(word)
    return label, options, env


def start_sides(bootstrap: str, args: Any, cpus: set[int]) -> list[Side]:
    work = c.workdir("lat")
    sides = []
    if not args.no_relay:
        names = c.topic_names("lat-relay")
        argv = [c.PYTHON, "-m", "bench.pipeline.relay", "--bootstrap", bootstrap, "--source", names["events"]]
        argv += ["--destination", names["decisions"], "--prefix", CALL_PREFIX]
        sides.append(Side(RELAY, names, c.Proc(argv, work / "relay.log")))
    for label, options, env in [(WORKER, [], {}), *map(variant, args.variant)]:
        names = c.topic_names(f"lat-{label}")
        trace = work / f"{label}-stages.jsonl"
        proc = c.worker(bootstrap, names, work, label, args.partitions, [*args.worker_args, *options])
        proc.argv += ["--trace-stages", str(trace)]
        proc.env.update(env)
        sides.append(Side(label, names, proc, trace))
    for side in sides:
        c.create_topics(bootstrap, side.names, args.partitions)
        c.stamp_on_append(bootstrap, [side.names["events"], side.names["decisions"]])
        side.proc.start()
    for side in sides:
        side.proc.wait_log("relay ready" if side.label == RELAY else "event=assigned", 180)
        if cpus:
            c.pin(side.proc.pid, cpus)
    return sides


def summarise(sides: list[Side], rows: list[dict[str, Any]], rates: list[int]) -> tuple[list[dict], list[dict]]:
    medians, stages = [], []
    for rate in rates:
        relay = None
        for side in sides:
            mine = [r for r in rows if r["offered_per_s"] == rate and r["side"] == side.label]
            row = {
                "offered_per_s": rate,
                "side": side.label,
                **{k: c.median([r[k] for r in mine]) for k in ("achieved_per_s", "p50_ms", "p99_ms", "max_ms")},
                "cpu_s": c.median([r["side_cpu_s"] for r in mine]),
                **({"broker_cpu_s": c.median([r["broker_cpu_s"] for r in mine])} if "broker_cpu_s" in mine[0] else {}),
                "load1": c.median([r["load1"] for r in mine]),
                "rounds": len(mine),
            }
            if side.label == RELAY:
                relay = row
            elif relay is not None:
                row["p50_ratio"] = row["p50_ms"] / relay["p50_ms"]
                row["p99_ratio"] = row["p99_ms"] / relay["p99_ms"]
            medians.append(row)
            per_round = [r["stages"] for r in mine]
            for name in per_round[0] if per_round else ():
                stages.append(
                    {
                        "offered_per_s": rate,
                        "side": side.label,
                        "stage": name,
                        **{q: c.median([p[name][q] for p in per_round if name in p]) for q in ("p50", "p99", "tail")},
                    }
                )
    return medians, stages


def pin_outside_sides(args: Any) -> set[int]:
    """With --side-cpus: this generator and the broker onto the cores the sides do not get."""
    if not args.side_cpus:
        return set()
    if not (args.bootstrap and args.broker_pid):
        raise SystemExit("--side-cpus needs --bootstrap and --broker-pid: the broker is pinned off the sides' cores")
    cpus = c.cpu_set(args.side_cpus)
    rest = os.sched_getaffinity(0) - cpus
    if not cpus or not rest:
        raise SystemExit(f"--side-cpus {args.side_cpus}: leaves no core for the generator and the broker")
    c.pin(os.getpid(), rest)
    c.pin(args.broker_pid, rest)
    return cpus


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--rates", default="500,2000", help="offered tool calls per second, comma-separated")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per drive (default 20)")
    p.add_argument("--warmup", type=float, default=5.0, help="uncounted seconds per drive (default 5)")
    p.add_argument("--runs", type=int, default=0, help="parallel runs (default: max(200, rate))")
    p.add_argument("--no-relay", action="store_true", help="no relay floor")
    p.add_argument("--variant", action="append", default=[], help="LABEL=OPTIONS: one more worker (repeatable)")
    p.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options of every worker (after --)")
    p.add_argument("--side-cpus", default="", help="CPUS (e.g. 1 or 2-3): the sides' cores; the others run the rest")
    p.add_argument(
        "--broker-pid",
        type=int,
        help="the --bootstrap broker's process: its CPU-s in each drive are reported; pinned with --side-cpus",
    )
    args = p.parse_args()
    rates = [int(x) for x in args.rates.split(",")]
    cpus = pin_outside_sides(args)
    broker_column = ["broker_cpu_s"] if args.broker_pid else []
    rows: list[dict[str, Any]] = []
    with c.broker(args.bootstrap) as bootstrap:
        sides = start_sides(bootstrap, args, cpus)
        try:
            for n in range(args.repeat):
                for rate in rates:
                    order = sides[n % len(sides) :] + sides[: n % len(sides)]
                    for side in order:
                        load, cpu0 = c.load_average(), c.cpu_seconds(side.proc.pid)
                        broker0 = c.cpu_seconds(args.broker_pid) if args.broker_pid else 0.0
                        row, samples = asyncio.run(
                            drive(
                                bootstrap,
                                side.names["events"],
                                side.names["decisions"],
                                rate,
                                args.duration,
                                args.warmup,
                                args.runs or max(200, rate),
                            )
                        )
                        row.update(round=n + 1, side=side.label, side_cpu_s=c.cpu_seconds(side.proc.pid) - cpu0)
                        row["load1"] = load
                        if args.broker_pid:
                            row["broker_cpu_s"] = c.cpu_seconds(args.broker_pid) - broker0
                        side.samples[(n, rate)] = samples
                        rows.append(row)
                        print(
                            c.table(
                                [row],
                                ["round", "side", "offered_per_s", "achieved_per_s", "p50_ms", "p99_ms", "max_ms"]
                                + ["deferred", "side_cpu_s", *broker_column, "load1"],
                            ),
                            flush=True,
                        )
        finally:
            for side in sides:
                side.proc.stop()  # a worker writes its last stage clocks as it stops
    for side in sides:
        traces = read_traces(side.trace) if side.trace else {}
        for row in rows:
            if row["side"] == side.label:
                row["stages"] = breakdown(side.samples[(row["round"] - 1, row["offered_per_s"])], traces)
    medians, stages = summarise(sides, rows, rates)
    print("\nmedians over rounds (ratios: worker median / relay median, same run):")
    columns = ["offered_per_s", "side", "achieved_per_s", "p50_ms", "p99_ms", "max_ms", "p50_ratio", "p99_ratio"]
    print(c.table(medians, [*columns, "cpu_s", *broker_column, "load1", "rounds"]))
    print("\nstages, ms (median over rounds of each stage's p50 and p99; tail: its median in the slowest 1 %):")
    print(c.table(stages, ["offered_per_s", "side", "stage", "p50", "p99", "tail"]))
    c.record("latency", args, {"runs": rows, "median": medians, "stages": stages})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
