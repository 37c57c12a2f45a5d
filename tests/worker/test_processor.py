"""The processor taking events, with fakes for Faust's app, its producer and the runs table."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
import weakref

import pytest

import streams.worker.processor as processor_module
from schemas.codec import BadEvent
from schemas.config import FleetConfig
from schemas.state import RunState, StoredRun
from streams.worker.checkpoint import finish
from streams.worker.processor import Processor
from streams.worker.settings import Settings
from streams.kafka.topics import Topics
from schemas.codec import decode_stored, encode_stored

SETTINGS = Settings(topics=Topics(events="ev", decisions="dec", deadletter="dl"))
CALL = b'{"type":"tool_call","run_id":"r1","seq":%d,"tool_call_id":"c","tool_name":"exec","args":{"cmd":"ls"}}'


@dataclass
class FakeProducer:
    """Sends complete when the test says so; a topic in ``refuse`` raises at send."""

    refuse: set[str] = field(default_factory=set)
    sent: list[tuple[str, bytes | None, asyncio.Future[Any]]] = field(default_factory=list)
    partitions: list[int | None] = field(default_factory=list)  # of each send in ``sent``
    batches: list[tuple[str, int, int, asyncio.Future[Any]]] = field(
        default_factory=list
    )  # (topic, partition, records, acknowledged)
    behind: list[bool] = field(default_factory=list)  # of each send_records

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None, *args: Any, **kw: Any
    ) -> Any:
        if topic in self.refuse:
            raise ValueError("MessageSizeTooLargeError: the message is too large")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, value, future))
        self.partitions.append(partition)
        return future

    async def send_records(
        self, topic: str, partition: int, records: list[tuple[bytes, bytes]], *, behind: bool = False
    ) -> list[Any]:
        """One batch; it gives (partition, its last record's offset) once acknowledged."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.batches.append((topic, partition, len(records), future))
        self.behind.append(behind)
        return [future]


class FakeStore:
    """A TableStore's partition-addressed reads and writes, in a dict."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, bytes], bytes] = {}
        self.writes: list[tuple[int, int]] = []  # (partition, values) of each write
        self.persisted: list[tuple[Any, int]] = []

    def get_in(self, partition: int, key: bytes) -> bytes | None:
        return self.rows.get((partition, key))

    def write_in(self, partition: int, items: list[tuple[bytes, bytes]]) -> None:
        self.writes.append((partition, len(items)))
        for key, value in items:
            self.rows[(partition, key)] = value

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.persisted.append((tp, offset))


def make_processor(producer: FakeProducer, settings: Settings = SETTINGS) -> Processor:
    app = SimpleNamespace(
        producer=producer,
        consumer=SimpleNamespace(ack=lambda message: None),
        in_transaction=False,
        assignor=SimpleNamespace(assigned_actives=set),  # owns nothing: no lag to report
    )
    table = SimpleNamespace(data=FakeStore(), changelog_topic_name="runs-changelog")
    return Processor(app, settings, FleetConfig(), table)  # type: ignore[arg-type]


def message(value: bytes, key: bytes = b"r1", offset: int = 0, partition: int = 0) -> Any:
    return SimpleNamespace(value=value, key=key, topic="ev", partition=partition, offset=offset, tp=("ev", partition))


def call_of(run: bytes, seq: int) -> bytes:
    return CALL.replace(b'"r1"', b'"' + run + b'"') % seq


async def finish_open(processor: Processor, producer: FakeProducer) -> None:
    """Close the open checkpoint and finish it, the broker acknowledging every
    send and batch as it comes (changelog records at offsets counted per partition)."""
    processor.checkpoints.close()
    finishing = asyncio.ensure_future(finish(processor.checkpoints.closed.popleft(), processor.states, processor._ack))
    next_offset: dict[int, int] = {}
    while not finishing.done():
        for (topic, _value, future), partition in zip(producer.sent, producer.partitions, strict=True):
            if not future.done():
                future.set_result(SimpleNamespace(topic_partition=(topic, partition), offset=0))
        for topic, partition, records, future in producer.batches:
            if not future.done():
                offset = next_offset[partition] = next_offset.get(partition, -1) + records
                future.set_result(((topic, partition), offset))
        await asyncio.sleep(0)
    finishing.result()


def test_a_refused_event_leaves_no_run_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine refuses the first event of a run: the run must not stay in
    the in-flight overlay (no checkpoint would ever remove it, and the sweep
    skips runs in flight)."""

    def refuse(state: Any, event: Any, config: Any) -> Any:
        raise BadEvent("unhashable", "cannot hash payload 'args': TypeError")

    monkeypatch.setattr(processor_module, "apply_safely", refuse)

    async def scenario() -> Processor:
        processor = make_processor(FakeProducer())
        await processor.take(message(CALL % 1))
        return processor

    processor = asyncio.run(scenario())
    assert processor.metrics.summary().get("events", 0) == 0
    assert processor.states.live == {}


def test_a_run_in_flight_keeps_its_state_across_events() -> None:
    async def scenario() -> Processor:
        processor = make_processor(FakeProducer())
        for seq in (1, 2):
            await processor.take(message(CALL % seq, offset=seq))
        return processor

    processor = asyncio.run(scenario())
    assert processor.metrics.summary().get("events", 0) == 2
    assert processor.states.live[(0, b"r1")].stored.state.last_seq == 2


class Weakly(SimpleNamespace):
    """A message a weak reference can watch."""


def test_a_finished_checkpoint_is_freed_without_the_cycle_collector() -> None:
    """Once its states are written, nothing a checkpoint held (events, states,
    send futures) waits for Python's cycle collector, whose passes over that
    much held the event loop for 15-35 ms each at 2,000 calls/s."""

    async def scenario() -> tuple[Processor, weakref.ref[Any]]:
        producer = FakeProducer()
        processor = make_processor(producer)
        event = Weakly(**vars(message(CALL % 1)))
        event_gone = weakref.ref(event)
        await processor.take(event)
        del event
        await finish_open(processor, producer)
        return processor, event_gone

    gc.disable()
    try:
        processor, event_gone = asyncio.run(scenario())
        assert not processor.states.live, "the written run left the overlay"
        assert event_gone() is None, "the event was freed as soon as its checkpoint was"
    finally:
        gc.enable()


def test_a_checkpoint_writes_each_partition_at_once_and_persists_its_highest_changelog_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One RocksDB write per partition (per slice of WRITES_PER_YIELD runs), and
    one persisted changelog offset per partition: the highest acknowledged."""
    monkeypatch.setattr("streams.worker.store.WRITES_PER_YIELD", 3)
    runs = [(0, b"a"), (1, b"b"), (0, b"c"), (0, b"d"), (0, b"e")]

    async def scenario() -> FakeStore:
        producer = FakeProducer()
        processor = make_processor(producer)
        for offset, (partition, key) in enumerate(runs):
            await processor.take(message(call_of(key, 1), key, offset, partition))
        await finish_open(processor, producer)
        return processor.states.store

    store = asyncio.run(scenario())
    assert sorted(store.writes) == [(0, 1), (0, 3), (1, 1)]
    assert {key for _, key in store.rows} == {key for _, key in runs}
    assert sorted(store.persisted) == [(("runs-changelog", 0), 3), (("runs-changelog", 1), 0)]


def test_a_worker_behind_its_events_sends_its_states_as_behind() -> None:
    """With half of ``max_in_flight`` events unfinished or more, a
    checkpoint's states go to the producer as ``behind`` (in larger
    changelog batches); with fewer, as keeping up."""
    settings = replace(SETTINGS, max_in_flight=4)

    async def scenario() -> tuple[list[bool], list[bool]]:
        producer = FakeProducer()
        processor = make_processor(producer, settings)
        said = []
        for offset, runs in enumerate([[b"a"], [b"b", b"c"]]):
            fed = [message(call_of(run, 1), run, 10 * offset + i) for i, run in enumerate(runs)]
            processor.feed(fed, 0.0)
            said.append(processor.behind())
            for m in fed:
                await processor.take(m)
            await finish_open(processor, producer)
        return said, producer.behind

    said, sent = asyncio.run(scenario())
    assert said == [False, True], "1 of 4 unfinished keeps up; 3 of 4 is behind"
    assert sent == said


def test_a_closed_checkpoint_writes_each_run_as_it_left_it() -> None:
    """Events of a run taken after its checkpoint closed, before that
    checkpoint is written, change nothing it writes: the run is encoded for
    it first (sealed). A run no later event touched is encoded at the write.
    The next checkpoint then writes the newer state."""

    async def scenario() -> tuple[list[int], list[int], Processor]:
        producer = FakeProducer()
        processor = make_processor(producer)
        await processor.take(message(call_of(b"busy", 1), b"busy", 0))
        await processor.take(message(call_of(b"quiet", 1), b"quiet", 1))
        processor.checkpoints.close()
        closed = processor.checkpoints.closed.popleft()
        assert closed.touched[(0, b"busy")].sealed is None, "closing encodes nothing"
        await processor.take(message(call_of(b"busy", 2), b"busy", 2))
        assert closed.touched[(0, b"busy")].sealed is not None, "sealed before the later event changed it"
        assert closed.touched[(0, b"quiet")].sealed is None
        rows = processor.states.store.rows
        finishing = asyncio.ensure_future(finish(closed, processor.states, processor._ack))
        while not finishing.done():
            for _topic, _value, future in producer.sent:
                if not future.done():
                    future.set_result(None)
            for topic, partition, records, future in producer.batches:
                if not future.done():
                    future.set_result(((topic, partition), records - 1))
            await asyncio.sleep(0)
        first = [decode_stored(rows[(0, key)]).state.last_seq for key in (b"busy", b"quiet")]
        assert set(processor.states.live) == {(0, b"busy")}, "the quiet run left the overlay, the busy one did not"
        await finish_open(processor, producer)
        second = [decode_stored(rows[(0, key)]).state.last_seq for key in (b"busy", b"quiet")]
        return first, second, processor

    first, second, processor = asyncio.run(scenario())
    assert first == [1, 1]
    assert second == [2, 1]
    assert not processor.states.live


def test_a_run_starts_from_its_stored_state() -> None:
    async def scenario() -> Processor:
        processor = make_processor(FakeProducer())
        processor.states.store.rows[(0, b"r1")] = encode_stored(StoredRun(1.0, RunState(last_seq=5)))
        await processor.take(message(CALL % 5))  # not above the stored seq: a duplicate
        return processor

    processor = asyncio.run(scenario())
    assert processor.metrics.summary().get("duplicates", 0) == 1
    assert decode_stored(processor.states.store.rows[(0, b"r1")]).state.last_seq == 5


def test_a_dead_letter_counts_once_the_broker_has_it() -> None:
    async def scenario() -> tuple[Processor, list[int]]:
        producer = FakeProducer()
        processor = make_processor(producer)
        await processor.take(message(b"not json"))
        counted = [processor.metrics.summary().get("deadlettered", 0)]
        [(topic, value, future)] = producer.sent
        assert (topic, value) == ("dl", b"not json")
        future.set_result(None)
        await asyncio.sleep(0)
        counted.append(processor.metrics.summary().get("deadlettered", 0))
        return processor, counted

    processor, counted = asyncio.run(scenario())
    assert counted == [0, 1]
    assert processor.metrics.summary().get("deadlettered.not_json", 0) == 1


def test_a_dead_letter_that_fails_is_not_counted_as_sent() -> None:
    async def scenario() -> tuple[Processor, asyncio.Future[Any]]:
        producer = FakeProducer()
        processor = make_processor(producer)
        await processor.take(message(b"not json"))
        [(_, _, future)] = producer.sent
        future.set_exception(ConnectionError("broker gone"))
        await asyncio.sleep(0)
        return processor, future

    processor, future = asyncio.run(scenario())
    assert processor.metrics.summary().get("deadlettered", 0) == 0
    # The checkpoint awaits this send: it fails, and nothing of it is acknowledged.
    assert processor.checkpoints.open.sent == [future]


def test_a_dead_letter_the_producer_refuses_is_counted_as_failed_only() -> None:
    async def scenario() -> Processor:
        processor = make_processor(FakeProducer(refuse={"dl"}))
        await processor.take(message(b"not json"))
        return processor

    processor = asyncio.run(scenario())
    assert processor.metrics.summary().get("deadlettered", 0) == 0
    assert processor.metrics.summary().get("deadletter_failed", 0) == 1


def test_every_refusal_carries_its_kind() -> None:
    async def scenario() -> list[str]:
        producer = FakeProducer()
        processor = make_processor(producer)
        for value, key in [
            (b"", b"r1"),
            (b"x" * (SETTINGS.max_event_bytes + 1), b"r1"),
            (CALL % 1, b"other"),
            (b'{"type":"nope","run_id":"r1","seq":1}', b"r1"),
            (b'{"run_id":"r1","seq":1}', b"r1"),
            (b'{"type":"tool_call","run_id":"r1","seq":"one"}', b"r1"),
        ]:
            await processor.take(message(value, key))
        for _, _, future in producer.sent:
            future.set_result(None)
        await asyncio.sleep(0)
        return sorted(k for k in processor.metrics.summary() if k.startswith("deadlettered."))

    assert asyncio.run(scenario()) == [
        "deadlettered.empty",
        "deadlettered.invalid",
        "deadlettered.key_mismatch",
        "deadlettered.missing_type",
        "deadlettered.too_large",
        "deadlettered.unknown_type",
    ]


TIMED_CALL = CALL[:-1] + b',"ts":%r}'


def latency(processor: Processor, series: str) -> float:
    (family,) = processor.metrics.verdict_latency.collect()
    return next(s.value for s in family.samples if s.name == f"loopwarden_verdict_latency_seconds_{series}")


def test_verdicts_are_timed_from_the_events_ts_and_their_stages_traced(tmp_path: Path) -> None:
    """Served metrics time each verdict from the gateway's ``ts``; with
    ``trace_stages`` each verdict's clocks reach the file once its send is
    acknowledged and its checkpoint finishes."""
    trace = tmp_path / "stages.jsonl"
    published = time.time() - 0.02

    async def scenario() -> tuple[Processor, list[list[Any]]]:
        producer = FakeProducer()
        processor = make_processor(producer, SETTINGS.with_(web_port=6066, trace_stages=trace))
        processor.feed([message(TIMED_CALL % (1, published)), message(CALL % 2, offset=1)], time.time())
        processor.polled_at, processor.fed_at, batch = processor.pending.popleft()
        for m in batch:
            await processor.take(m)
        checkpoint = processor.checkpoints.open
        processor.checkpoints.close()
        processor._finished(checkpoint)
        unacknowledged = trace.read_bytes()
        for _topic, _value, future in producer.sent:
            future.set_result(None)
        await asyncio.sleep(0)  # the done callbacks
        processor._finished(checkpoint)
        assert unacknowledged == b""
        return processor, [json.loads(line) for line in trace.read_bytes().splitlines()]

    processor, rows = asyncio.run(scenario())
    assert latency(processor, "count") == 1  # the call without ts is left out
    assert latency(processor, "sum") >= 0.02
    assert [(run_id, seq, ts) for run_id, seq, ts, *_ in rows] == [("r1", 1, published), ("r1", 2, None)]
    for _run_id, _seq, _ts, polled, fetched, taken, sent, acked in rows:
        assert polled <= fetched <= taken <= sent <= acked


def test_without_served_metrics_or_a_trace_nothing_is_timed() -> None:
    async def scenario() -> Processor:
        processor = make_processor(FakeProducer())
        await processor.take(message(TIMED_CALL % (1, time.time())))
        return processor

    processor = asyncio.run(scenario())
    assert processor.trace is None
    assert latency(processor, "count") == 0
