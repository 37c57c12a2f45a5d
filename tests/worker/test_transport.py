"""The worker's transport: the fetch pacer (fetches held while events stream
in, never while they trickle or stop), the key partitioner and the producer's
record batches and their compression (on a real broker)."""

from __future__ import annotations

import asyncio
import uuid
from hashlib import sha256
from typing import Any

import faust
import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from faust.types import TP

from schemas.codec import encode_stored
from schemas.state import Record, RunState, StoredRun
from streams.kafka import clients as kafka_clients
from streams.tools.broker import LocalBroker
from streams.kafka.topics import ensure
from streams.seams.faust import aiokafka_producer
from streams.worker.settings import CHANGELOG_COMPRESSIONS
from streams.worker.transport import CODECS, SCHEME, FetchPacer, KeyPartitioner, codec_for
from helpers import consume


def feed(pacer: FetchPacer, per_second: int, seconds: float, start: float, step: float = 0.01) -> list[bool]:
    """Batches every ``step`` seconds at ``per_second``; the changes the pacer asked for."""
    changes = []
    ticks = round(seconds / step)
    for tick in range(1, ticks + 1):
        change = pacer.observe(round(per_second * step), start + tick * step)
        if change is not None:
            changes.append(change)
    return changes


def test_a_stream_of_two_or_more_events_per_hold_is_held() -> None:
    pacer = FetchPacer(hold=0.002)
    assert feed(pacer, 2000, 1.0, start=0.0) == [True]
    assert pacer.held


def test_a_trickle_is_never_held() -> None:
    pacer = FetchPacer(hold=0.002)
    assert feed(pacer, 500, 2.0, start=0.0) == []  # one event per hold: each fetch would come back nearly empty


def test_held_fetches_are_released_when_the_stream_stops_or_thins() -> None:
    pacer = FetchPacer(hold=0.002)
    feed(pacer, 2000, 1.0, start=0.0)
    assert feed(pacer, 700, 1.0, start=1.0) == []  # above one per hold: still held (no flapping at the edge)
    assert feed(pacer, 300, 1.0, start=2.0) == [False]
    # Idle, the consumer's poll returns empty once its timeout ends: that releases too.
    pacer = FetchPacer(hold=0.002)
    feed(pacer, 2000, 1.0, start=0.0)
    assert pacer.observe(0, 2.0) is False


def test_a_rate_is_judged_over_a_whole_window() -> None:
    pacer = FetchPacer(hold=0.002, window=0.25)
    assert pacer.observe(400, 0.0) is None  # a burst opens the window...
    assert pacer.observe(0, 0.1) is None  # ...which is judged only once it is over
    assert pacer.observe(0, 0.3) is True  # 400 events in 0.3 s: 2.7 per 2 ms hold
    assert pacer.observe(100, 0.4) is None
    assert pacer.observe(0, 0.6) is False  # 100 in 0.3 s: 0.67 per hold


def test_a_hold_of_zero_never_holds() -> None:
    assert feed(FetchPacer(hold=0.0), 20000, 1.0, start=0.0) == []


KEYS = [f"run-{i:04d}".encode() for i in range(400)] + [b"", b"x", "zażółć-gęślą".encode(), bytes(range(256))]


def test_the_key_partitioner_places_every_key_where_kafka_does() -> None:
    partitioner, default = KeyPartitioner(), DefaultPartitioner()
    for count in (1, 3, 12, 64):
        partitions = list(range(count))
        for key in KEYS + KEYS:  # the second time from its memory
            assert partitioner(key, partitions, partitions) == default(key, partitions, partitions), (key, count)


def test_the_key_partitioner_forgets_when_full_and_still_answers_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KeyPartitioner, "MAX_KEYS", 8)
    partitioner, default = KeyPartitioner(), DefaultPartitioner()
    partitions = list(range(12))
    for key in KEYS:
        assert partitioner(key, partitions, partitions) == default(key, partitions, partitions)
        assert len(partitioner._hashes) <= 8


def test_a_keyless_message_goes_to_an_available_partition() -> None:
    assert {KeyPartitioner()(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}


def send_records(
    bootstrap: str,
    topic: str,
    groups: list[list[tuple[bytes, bytes]]],
    *,
    compression: str,
    batch_bytes: int,
    behind: bool = False,
    handed: list[bool] | None = None,
) -> list[list[tuple[TP, int]]]:
    """Each group of records through one ``send_records`` to partition 1, by
    the worker's producer, with batches of ``batch_bytes`` (keeping up) and
    four times that (behind); what each group's awaitables gave. ``handed``
    gets, for each batch handed to aiokafka, whether every earlier one had
    been acknowledged by then."""
    app = faust.App(
        f"batches-{uuid.uuid4().hex[:8]}",
        **kafka_clients.faust_connection(bootstrap, transport=SCHEME),
        autodiscover=False,
    )
    app.changelog_compression = compression

    async def send() -> list[list[tuple[TP, int]]]:
        producer = app.producer
        producer.records_batch_bytes = batch_bytes
        producer.records_batch_bytes_behind = 4 * batch_bytes
        await producer.start()
        if handed is not None:
            watch_batches(aiokafka_producer(producer), handed)
        try:
            return [
                await asyncio.gather(*await producer.send_records(topic, 1, group, behind=behind)) for group in groups
            ]
        finally:
            await producer.stop()

    return asyncio.run(send())


def watch_batches(aiokafka_producer: Any, handed: list[bool]) -> None:
    """Note in ``handed``, as each batch reaches the aiokafka producer,
    whether the deliveries of those before it are done."""
    send_batch = aiokafka_producer.send_batch
    deliveries: list[asyncio.Future[Any]] = []

    async def watched(batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        handed.append(all(delivery.done() for delivery in deliveries))
        delivery = await send_batch(batch, topic, partition=partition)
        deliveries.append(delivery)
        return delivery

    aiokafka_producer.send_batch = watched


@pytest.mark.integration
def test_records_sent_as_batches_land_in_order_and_report_their_last_offsets(broker: LocalBroker) -> None:
    """Records larger together than one batch go in several, and a record
    larger than a batch in one of its own; each awaitable gives the partition
    and the offset of its batch's last record."""
    topic = f"batches-{uuid.uuid4().hex[:8]}"
    ensure(broker.bootstrap, [(topic, 2, {})], 1)
    records = [(f"k{i}".encode(), bytes([65 + i % 26]) * (9000 if i == 5 else 900)) for i in range(20)]
    first, second = send_records(
        broker.bootstrap, topic, [records[:12], records[12:]], compression="none", batch_bytes=4096
    )
    assert len(first) >= 4, "11 records of 900 bytes and one of 9,000 do not fit in one batch of 4 KiB"
    assert {tp for tp, _ in first + second} == {TP(topic, 1)}
    offsets = [offset for _, offset in first + second]
    assert offsets == sorted(set(offsets))
    assert (first[-1][1], second[-1][1]) == (11, 19)
    landed = consume(broker.bootstrap, topic, count=20, timeout=30)
    assert [(r.partition, r.offset, r.key, r.value) for r in landed] == [
        (1, offset, key, value) for offset, (key, value) in enumerate(records)
    ]


@pytest.mark.integration
def test_a_worker_behind_sends_the_same_records_in_fewer_larger_batches(broker: LocalBroker) -> None:
    topic = f"behind-{uuid.uuid4().hex[:8]}"
    ensure(broker.bootstrap, [(topic, 2, {})], 1)
    records = [(f"k{i}".encode(), bytes([65 + i % 26]) * 900) for i in range(24)]
    [keeping_up] = send_records(broker.bootstrap, topic, [records], compression="none", batch_bytes=4096)
    [behind] = send_records(broker.bootstrap, topic, [records], compression="none", batch_bytes=4096, behind=True)
    assert len(keeping_up) >= 6, "24 records of 900 bytes take six batches of 4 KiB or more"
    assert len(behind) <= len(keeping_up) // 3, (keeping_up, behind)
    assert (keeping_up[-1][1], behind[-1][1]) == (23, 47)
    landed = consume(broker.bootstrap, topic, count=48, timeout=30)
    assert [(r.key, r.value) for r in landed] == records + records


@pytest.mark.integration
def test_keeping_up_each_batch_waits_for_the_last_to_be_acknowledged(broker: LocalBroker) -> None:
    """So that a produce request carries one changelog batch at most; behind,
    the batches go to the producer as fast as it takes them."""
    topic = f"paced-{uuid.uuid4().hex[:8]}"
    ensure(broker.bootstrap, [(topic, 2, {})], 1)
    records = [(f"k{i}".encode(), bytes([65 + i % 26]) * 900) for i in range(24)]
    keeping_up: list[bool] = []
    behind: list[bool] = []
    send_records(
        broker.bootstrap, topic, [records[:12], records[12:]], compression="none", batch_bytes=4096, handed=keeping_up
    )
    send_records(broker.bootstrap, topic, [records], compression="none", batch_bytes=2048, behind=True, handed=behind)
    assert len(keeping_up) >= 6 and all(keeping_up), keeping_up
    assert len(behind) >= 2 and not all(behind), behind
    landed = consume(broker.bootstrap, topic, count=48, timeout=30)
    assert [(r.key, r.value) for r in landed] == records + records


def full_state(run: int) -> bytes:
    """A stored run with a full history of distinct calls, as a busy worker writes them."""
    history = [
        Record(
            "read",
            f"read:{sha256(f'{run}/{i}'.encode()).hexdigest()}",
            f"c{i}",
            result_hash=sha256(b"%d" % i).hexdigest(),
        )
        for i in range(30)
    ]
    return encode_stored(StoredRun(1.0, RunState(last_seq=60, history=history)))


def log_bytes(bootstrap: str, topic: str, partition: int) -> int:
    """How many bytes the broker's log of one partition holds."""
    admin = kafka_clients.admin(bootstrap)
    try:
        [described] = admin.describe_log_dirs({topic: [partition]})
    finally:
        admin.close()
    return sum(
        p["partition_size"]
        for log_dir in described["log_dirs"]
        for t in log_dir["topics"]
        if t["name"] == topic
        for p in t["partitions"]
        if p["partition_index"] == partition
    )


async def read_back(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of a topic's first ``count`` records, by aiokafka (which Faust's recovery reads with)."""
    consumer = kafka_clients.aio_consumer(bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 1)])
        await consumer.seek_to_beginning()
        landed: list[tuple[bytes, bytes]] = []
        while len(landed) < count:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            landed += [(r.key, r.value) for records in batch.values() for r in records]
        return landed
    finally:
        await consumer.stop()


@pytest.mark.integration
def test_compressed_batches_take_less_of_the_log_and_read_back_whole(broker: LocalBroker) -> None:
    """zstd (``--changelog-compression zstd``): run states (mostly hex
    digests) take under 60 % of their bytes in the broker's log, and come
    back byte for byte."""
    states = [(f"run-{i}".encode(), full_state(i)) for i in range(60)]
    raw = sum(len(key) + len(value) for key, value in states)
    sizes = {}
    for compression in ("zstd", "none"):
        topic = f"compressed-{compression}-{uuid.uuid4().hex[:8]}"
        ensure(broker.bootstrap, [(topic, 2, {})], 1)
        [acked] = send_records(broker.bootstrap, topic, [states], compression=compression, batch_bytes=64 * 1024)
        assert acked[-1] == (TP(topic, 1), 59)
        assert asyncio.run(read_back(broker.bootstrap, topic, 60)) == states
        sizes[compression] = log_bytes(broker.bootstrap, topic, 1)
    assert sizes["none"] > raw
    assert sizes["zstd"] < 0.6 * raw, sizes


def test_a_compression_is_refused_with_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert codec_for("none") == 0
    with pytest.raises(
        ValueError, match="unknown compression 'brotli' \\(expected one of zstd, lz4, snappy, gzip, none\\)"
    ):
        codec_for("brotli")
    monkeypatch.setitem(CODECS, "zstd", (lambda: False, CODECS["zstd"][1]))
    with pytest.raises(ValueError, match="zstd compression needs the cramjam package"):
        codec_for("zstd")


def test_every_compression_the_worker_accepts_has_a_codec() -> None:
    assert set(CODECS) == set(CHANGELOG_COMPRESSIONS)
    assert all(installed() for installed, _ in CODECS.values()), "cramjam comes with the package"
