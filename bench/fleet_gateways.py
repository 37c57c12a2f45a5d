"""Simulated gateways for bench/fleet_sim.py: one asyncio loop (one process)
runs a share of the fleet.

Each gateway owns runs of the realistic fleet trace (bench/fleet_trace.py,
the same seed in every process, gateway g taking runs g, g + G, g + 2G, …;
or of a trace given as lines)
and plays them a few at a time: every event of a run in order, each with
`reply_partition` = the gateway's own partition of the decisions topic,
waiting for a tool call's verdict (or its timeout) before the run's next
event, and an exponential think time before each call. It reads only its
reply partition (its own aiokafka consumer, no group). The events of a
process's gateways go through one shared idempotent producer, as the
threads of one gateway process would share theirs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from streams.kafka import clients as kafka_clients


@dataclass(frozen=True)
class Share:
    """What one process simulates; the same trace arguments in every process."""

    bootstrap: str
    events_topic: str
    decisions_topic: str
    gateways: Sequence[int]  # the gateway indexes this process runs
    fleet: int  # gateways in the whole fleet
    trace_runs: int
    trace_events: int
    seed: int
    slots: int  # runs a gateway plays at once
    think: float  # mean seconds before each call
    timeout: float  # a call without a verdict by then counts as a timeout
    ready: Any  # a queue: this process puts its index once its gateways' readers are positioned
    start: Any  # a queue: the wall clock time all processes start at, one per process
    seconds: float  # no new call is started after this many seconds
    settle: float  # seconds the readers keep reading after the last call
    keep_verdicts: bool  # return every verdict read (for checking against replay)
    idempotent: bool
    lines: Sequence[bytes] = ()  # a trace to play instead of the generated one


class _Ident(msgspec.Struct):
    run_id: str
    seq: int


class _Event(msgspec.Struct):
    type: str
    run_id: str
    seq: int


@dataclass
class Outcome:
    """One process's record, sent back to the parent (plain data only)."""

    calls: list[tuple[float, float | None]] = field(default_factory=list)  # (sent, latency or None: timeout)
    published: dict[str, int] = field(default_factory=dict)  # run id -> events published
    sent_bytes: int = 0  # keys and values of the events
    read_bytes: int = 0  # keys and values read from the reply partitions
    verdicts: int = 0
    duplicates: int = 0
    late: int = 0
    publish_failed: int = 0
    lines: list[bytes] = field(default_factory=list)  # the distinct verdicts read, when kept
    cpu_seconds: float = 0.0  # this process's CPU while its gateways played


def runs_of(share: Share) -> dict[int, list[list[bytes]]]:
    """Gateway -> its runs, each a list of event lines (no newline), in trace order."""
    from bench.fleet_trace import generate_lines

    mine = set(share.gateways)
    plays: dict[int, list[list[bytes]]] = {g: [] for g in mine}
    runs: dict[str, list[bytes] | None] = {}  # None: another process's run
    decoder = msgspec.json.Decoder(_Event)
    trace = share.lines or generate_lines(share.trace_runs, share.trace_events, seed=share.seed)
    for line in trace:
        run_id = decoder.decode(line).run_id
        if run_id not in runs:
            gateway = len(runs) % share.fleet
            runs[run_id] = [] if gateway in mine else None
            if gateway in mine:
                plays[gateway].append(runs[run_id])
        run = runs[run_id]
        if run is not None:
            run.append(line.rstrip(b"\n"))
    return plays


def published(share: Share, out: Outcome) -> list[bytes]:
    """The event lines the gateways of ``share`` published, as sent, run by run."""
    decoder = msgspec.json.Decoder(_Event)
    lines: list[bytes] = []
    for gateway, runs in runs_of(share).items():
        for run in runs:
            sent = out.published.get(decoder.decode(run[0]).run_id, 0)
            lines += [with_reply(line, gateway) for line in run[:sent]]
    return lines


def with_reply(line: bytes, partition: int) -> bytes:
    """The event line with `reply_partition` added (the line is a JSON object)."""
    return line[:-1] + b',"reply_partition":%d}' % partition


class _Gateway:
    def __init__(self, index: int, runs: list[list[bytes]], share: Share, producer: Any, out: Outcome) -> None:
        self.index, self.runs, self.share, self.producer, self.out = index, runs, share, producer, out
        self.waiters: dict[tuple[str, int], tuple[float, asyncio.Future[None]]] = {}
        self.seen: set[tuple[str, int]] = set()
        self.rng = random.Random(f"{share.seed}/{index}")
        self.deadline = math.inf
        self.ready = asyncio.Event()

    async def read(self, stop: asyncio.Event) -> None:
        from aiokafka import TopicPartition

        consumer = kafka_clients.aio_consumer(
            self.share.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=500,  # a long poll: answered as soon as a verdict comes
            retry_backoff_ms=100,
        )
        await consumer.start()
        decoder = msgspec.json.Decoder(_Ident)
        try:
            tp = TopicPartition(self.share.decisions_topic, self.index)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            await consumer.position(tp)
            self.ready.set()
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                now = time.time()
                for records in batch.values():
                    for record in records:
                        self.out.read_bytes += len(record.key or b"") + len(record.value or b"")
                        verdict = decoder.decode(record.value)
                        ident = (verdict.run_id, verdict.seq)
                        if ident in self.seen:
                            self.out.duplicates += 1
                            continue
                        self.seen.add(ident)
                        self.out.verdicts += 1
                        if self.share.keep_verdicts:
                            self.out.lines.append(record.value)
                        waiter = self.waiters.pop(ident, None)
                        if waiter is None:
                            continue
                        sent, done = waiter
                        if done.done():
                            self.out.late += 1
                        else:
                            done.set_result(None)
                            self.out.calls.append((sent, now - sent))
        finally:
            await consumer.stop()

    async def play(self, slot: int) -> None:
        decoder = msgspec.json.Decoder(_Event)
        for run in self.runs[slot :: self.share.slots]:
            published = 0
            for line in run:
                if time.time() >= self.deadline:
                    return
                event = decoder.decode(line)
                value = with_reply(line, self.index)
                key = event.run_id.encode()
                if event.type == "tool_call":
                    await asyncio.sleep(self.rng.expovariate(1.0 / self.share.think) if self.share.think else 0)
                    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    sent = time.time()
                    self.waiters[(event.run_id, event.seq)] = (sent, done)
                    await self.send(key, value)
                    try:
                        await asyncio.wait_for(asyncio.shield(done), self.share.timeout)
                    except TimeoutError:
                        done.cancel()
                        self.out.calls.append((sent, None))
                else:
                    await self.send(key, value)
                published += 1
                self.out.published[event.run_id] = published

    async def send(self, key: bytes, value: bytes) -> None:
        self.out.sent_bytes += len(key) + len(value)
        try:
            delivery = await self.producer.send(self.share.events_topic, value, key=key)
        except Exception:  # a publish the producer refused: the call times out
            self.out.publish_failed += 1
            return
        delivery.add_done_callback(self._delivered)

    def _delivered(self, delivery: asyncio.Future[Any]) -> None:
        if delivery.cancelled() or delivery.exception() is not None:
            self.out.publish_failed += 1


async def simulate(share: Share) -> Outcome:
    plays = runs_of(share)
    out = Outcome()
    options: dict[str, Any] = {"acks": "all", "linger_ms": 2, "request_timeout_ms": 30000}
    if share.idempotent:
        options["enable_idempotence"] = True
    producer = kafka_clients.aio_producer(share.bootstrap, **options)
    await producer.start()
    gateways = [_Gateway(g, plays[g], share, producer, out) for g in share.gateways]
    stop = asyncio.Event()
    readers = []
    for gateway in gateways:
        readers.append(asyncio.create_task(gateway.read(stop)))
    await _ready(gateways, readers)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, share.ready.put, share.gateways[0])
    start_at = await loop.run_in_executor(None, share.start.get)
    for gateway in gateways:
        gateway.deadline = start_at + share.seconds
    await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    try:
        await asyncio.gather(*(g.play(slot) for g in gateways for slot in range(share.slots)))
        out.cpu_seconds = time.process_time() - cpu
        await producer.flush()
        await asyncio.sleep(share.settle)
    finally:
        stop.set()
        await asyncio.gather(*readers, return_exceptions=True)
        await producer.stop()
    return out


def run(share: Share) -> Outcome:
    """The process entry point (multiprocessing: module level, picklable).
    aiokafka's per-request errors while a broker is down are not printed:
    the gateways count what they see (timeouts, failed publishes) themselves."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return asyncio.run(simulate(share))


async def _ready(gateways: Sequence[_Gateway], readers: Sequence[asyncio.Task[None]]) -> None:
    """Every reader positioned at the end of its partition; a reader that failed raises here."""
    positioned = asyncio.ensure_future(asyncio.gather(*(g.ready.wait() for g in gateways)))
    done, _ = await asyncio.wait([positioned, *readers], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not positioned:
            task.result()
            raise RuntimeError("a gateway's reader stopped before it was positioned")
