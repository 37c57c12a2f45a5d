"""faust-streaming's non-public members that loopwarden relies on (see ``streams.seams``).

Faust's hooks here are private methods its own subclasses override; each
class below overrides one and calls a public method of its own instead, so
loopwarden's subclasses (streams/worker/transport.py, streams/faustapp/)
override only public names.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import aiokafka
from faust.stores import rocksdb
from faust.transport import conductor
from faust.transport import consumer as base_consumer
from faust.transport.drivers import aiokafka as driver
from faust.types import TP
from faust.worker import Worker as FaustWorker

from streams.seams import Seam, attribute, method


class ConsumerThread(driver.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, telling when each poll of aiokafka returns."""

    async def _fetch_records(self, *args: Any, **kwargs: Any) -> Any:
        # The thread's poll of aiokafka: Faust has no hook around it.
        records = await super()._fetch_records(*args, **kwargs)
        self.polled()
        return records

    def polled(self) -> None:
        """A poll of aiokafka has returned (with records or without)."""


class Producer(driver.Producer):
    """Faust's aiokafka producer, with settings of its own added to those the aiokafka producer is made with."""

    def _settings_extra(self) -> Mapping[str, Any]:
        # The driver's only hook on the aiokafka producer's settings (its transactions' own).
        return {**super()._settings_extra(), **self.extra_settings()}

    def extra_settings(self) -> Mapping[str, Any]:
        """Settings added to the aiokafka producer's."""
        return {}


def aiokafka_consumer(thread: driver.AIOKafkaConsumerThread) -> aiokafka.AIOKafkaConsumer:
    """The aiokafka consumer a started consumer thread runs: Faust keeps it private."""
    return thread._consumer


class Consumer(driver.Consumer):
    """Faust's aiokafka consumer with its consumer thread and its fetch loop chosen by public methods."""

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        # The factory Faust's base class leaves to its drivers: no public way to choose the thread.
        return self.new_consumer_thread()

    def new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        """The consumer thread, made once as the consumer is made."""
        return super()._new_consumer_thread()

    async def _drain_messages(self, fetcher: Any) -> None:
        # The fetch loop Faust's Fetcher runs: no public hook.
        await self.drain_messages(fetcher)

    async def drain_messages(self, fetcher: Any) -> None:
        """Fetch and deliver until ``fetcher`` or the consumer stops (Faust's loop)."""
        await super()._drain_messages(fetcher)


def read_offsets(consumer: base_consumer.Consumer) -> MutableMapping[TP, int | None]:
    """The offset last taken per partition, which Faust's seeks reset and its
    fetch loop skips duplicates by: a fetch loop of its own must keep it."""
    return consumer._read_offset


#: Record offsets that never reach a stream (transaction markers, compaction)
#: as done, so that commits pass them, as Faust's own fetch loop does.
add_gap = base_consumer.Consumer._add_gap

#: The started aiokafka producer of Faust's producer, as Faust's own ``send``
#: reaches it: Faust keeps it private.
aiokafka_producer = driver.Producer._ensure_producer


class Conductor(conductor.Conductor):
    """Faust's conductor with its resubscription delay as a public attribute."""

    #: Seconds between a change of the topics and the resubscription (Faust's: 45).
    resubscribe_delay: float = conductor.Conductor._resubscribe_sleep_lock_seconds

    @property
    def _resubscribe_sleep_lock_seconds(self) -> float:  # type: ignore[override]
        # Faust reads its delay from this class attribute; no setting.
        return self.resubscribe_delay


class Store(rocksdb.Store):
    """Faust's RocksDB store, with each partition's database seen as it is opened."""

    def _open_for_partition(self, partition: int) -> Any:
        # The base class's opener of a partition's database: no public hook.
        return self.opened(super()._open_for_partition(partition))

    def opened(self, db: Any) -> Any:
        """A partition's database, just opened; what the store keeps."""
        return db


#: One partition's database, opened if need be, as the store's own reads do:
#: Faust picks it only from the task's current event otherwise.
partition_db = rocksdb.Store._db_for_partition


class Worker(FaustWorker):
    """Faust's worker, telling when a stop signal (SIGTERM, SIGINT) arrives."""

    def _flag_as_shutdown_by_signal(self) -> None:
        # Both of Faust's signal handlers call this: no public hook.
        super()._flag_as_shutdown_by_signal()
        self.stop_signalled()

    def stop_signalled(self) -> None:
        """A stop signal arrived (called again for each further one)."""


RELIED_ON: tuple[Seam, ...] = (
    method(
        driver.AIOKafkaConsumerThread,
        "_fetch_records",
        ("self", "consumer", "active_partitions", "timeout", "max_records"),
        "the thread's poll of aiokafka",
    ),
    attribute(driver.AIOKafkaConsumerThread, "_consumer", "the aiokafka consumer", on_instance=False),
    method(driver.Consumer, "_new_consumer_thread", ("self",), "the factory of the consumer thread"),
    method(base_consumer.Consumer, "_drain_messages", ("self", "fetcher"), "the fetch loop"),
    attribute(base_consumer.Consumer, "_read_offset", "the offsets taken, per partition"),
    method(base_consumer.Consumer, "_add_gap", ("self", "tp", "offset_from", "offset_to"), "offsets never streamed"),
    method(driver.Producer, "_ensure_producer", ("self",), "the aiokafka producer"),
    method(driver.Producer, "_settings_extra", ("self",), "the aiokafka producer's extra settings"),
    attribute(conductor.Conductor, "_resubscribe_sleep_lock_seconds", "the resubscription delay", on_instance=False),
    method(rocksdb.Store, "_open_for_partition", ("self", "partition"), "a partition's database opened"),
    method(rocksdb.Store, "_db_for_partition", ("self", "partition"), "a partition's database by number"),
    method(FaustWorker, "_flag_as_shutdown_by_signal", ("self",), "the signal handlers' common call"),
)
