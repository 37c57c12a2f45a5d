"""The corrected consumer of both apps, on a real broker through the fleet
stage's transport: records that Faust drops because the flow was suspended
when they were fetched are fetched again after its seek to the committed
offsets, also on a partition with no committed offset."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import faust
import pytest
from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as driver

from helpers import produce
from streams.faustapp.consumer import Consumer
from streams.fleet import transport
from streams.kafka import clients as kafka_clients
from streams.kafka.topics import ensure
from streams.seams.faust import aiokafka_consumer
from streams.tools.broker import LocalBroker

RECORDS = [b"one", b"two", b"three"]


def fetched_after_the_seek(
    bootstrap: str,
    topic: str,
    scheme: str,
    new_thread: Callable[[faust.App], driver.AIOKafkaConsumerThread],
    datadir: Path,
) -> list[bytes]:
    """Through a consumer thread of a new group (nothing committed): fetch
    every record of partition 0, drop them as Faust's ``getmany`` does when
    the flow is suspended, seek to the committed offsets as it then does,
    and fetch again; the values of that second fetch."""
    app = faust.App(
        f"refetch-{uuid.uuid4().hex[:8]}",
        **kafka_clients.faust_connection(bootstrap, transport=scheme),
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        datadir=str(datadir),
    )
    tp = TopicPartition(topic, 0)

    async def fetch(thread: driver.AIOKafkaConsumerThread, wanted: int, within: float) -> list[bytes]:
        values: list[bytes] = []
        deadline = time.monotonic() + within
        while len(values) < wanted and time.monotonic() < deadline:
            records = await thread.getmany({tp}, timeout=1.0)
            values += [record.value for record in records.get(tp, [])]
        return values

    async def run() -> list[bytes]:
        thread = new_thread(app)
        await thread.start()
        try:
            await thread.call_thread(aiokafka_consumer(thread).assign, [tp])
            assert await fetch(thread, len(RECORDS), 60.0) == RECORDS  # fetched, then dropped
            assert not any(offset for offset in (await thread.seek_to_committed()).values())
            return await fetch(thread, len(RECORDS), 5.0)
        finally:
            await thread.stop()

    return asyncio.run(run())


@pytest.fixture
def topic(broker: LocalBroker) -> str:
    name = f"refetch-{uuid.uuid4().hex[:8]}"
    ensure(broker.bootstrap, [(name, 1, {})], 1)
    produce(broker.bootstrap, name, RECORDS, keys=[None] * len(RECORDS))
    return name


@pytest.mark.integration
def test_records_dropped_by_a_suspension_are_fetched_again_where_nothing_was_committed(
    broker: LocalBroker, topic: str, tmp_path: Path
) -> None:
    def stage_thread(app: faust.App) -> driver.AIOKafkaConsumerThread:
        assert isinstance(app.consumer, Consumer), "the stage's scheme gives the corrected consumer"
        return app.consumer.new_consumer_thread()

    assert fetched_after_the_seek(broker.bootstrap, topic, transport.SCHEME, stage_thread, tmp_path) == RECORDS


@pytest.mark.integration
def test_with_fausts_own_consumer_thread_they_are_never_fetched_again(
    broker: LocalBroker, topic: str, tmp_path: Path
) -> None:
    """The failure the stage's transport corrects: aiokafka's seek leaves a
    partition with no committed offset where it is, past the dropped records."""

    def fausts_thread(app: faust.App) -> driver.AIOKafkaConsumerThread:
        return driver.AIOKafkaConsumerThread(app.consumer, loop=app.loop, beacon=app.consumer.beacon)

    assert fetched_after_the_seek(broker.bootstrap, topic, "kafka", fausts_thread, tmp_path) == []
