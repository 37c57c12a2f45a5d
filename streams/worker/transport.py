"""The worker's Kafka transport: Faust's aiokafka driver, subclassed.

Registered under the ``loopwarden://`` broker scheme (the ``faust.transports``
entry point in pyproject.toml), which only the worker's app uses. What
differs from the driver it extends:

- **An idempotent producer, acks=all.** Faust makes one only for
  transactions; here it always is (``IdempotentProducer``), as every
  producer of the project: on a replicated cluster a write survives a lost
  broker, and the retries after a lost leader neither double nor reorder a
  run's verdicts (``streams.faustapp.producer``, the fleet stage's too).

- **Batched intake.** Faust delivers every fetched message on its own: two
  tasks to race the delivery against a flow suspension, the conductor's lock,
  an Event object, a channel queue, the stream iterator and its
  acknowledgement bookkeeping, about 400 µs of CPU per message on this
  project's benchmark machine, whatever the agent does. Here each batch that
  ``Consumer.getmany`` returns (it stops early when the flow is suspended for
  a rebalance and drops records of an older generation) is tracked for
  commits exactly as Faust tracks a message and handed to the app's intake in
  one synchronous call. Messages of every other topic (the table changelogs
  read during recovery) go through Faust's own delivery, unchanged.
  Acknowledgement stays Faust's: the processor calls ``Consumer.ack`` for each
  message once it is finished, Faust commits acknowledged offsets, and a
  rebalance waits (``wait_empty``) until every tracked message is acknowledged.
- **No consumer thread.** Faust runs aiokafka in a thread of its own and
  asks it for each batch across two event loops; here aiokafka runs on the
  app's loop (``LoopConsumer``), as in a bare consume → produce relay, which
  took most of a verdict's extra wait away
  (bench/notes/2026-12-02-consumer-on-the-loop.md). A seek to the committed offsets holds the fetch loop until it
  is done (``Consumer.perform_seek``), so that nothing fetched meanwhile is
  taken and then read again.
- **Held fetches.** While events stream in, the broker is asked to hold
  each fetch up to ``--fetch-hold`` to fill it (``FetchPacer``); idle, a
  fetch waits for its first event, as Faust's do.
- **Cheaper sends.** A verdict's partition is Kafka's default for its key,
  remembered per run (``KeyPartitioner``); a checkpoint's changelog records
  go to the producer as whole record batches of their own size and
  compression, one acknowledged before the next while the worker keeps up
  (``Producer.send_records``).
- **Topics added while running** (a tenant's events topic) are subscribed a
  second later, not 45 s (``Conductor``).
- **Two rebalance corrections**, shared with the fleet stage's transport
  (``streams.faustapp.consumer``; docs/PROCESSING.md tells how each was
  found); a third, on the flow control, is ``streams.faustapp.app.FlowControl``.

Faust offers no public hook for the fetch loop, the consumer thread or the
poll; those, and the few other members of Faust, mode and aiokafka that are
not public, are reached through ``streams.seams`` (one module per package,
each use with its reason), checked by tests/seams/test_seams.py against the
pinned versions. So are the aiokafka members the decompression bound of the
events topics replaces (the fetcher's ``PartitionRecords``, the record
modules' decoders, streams/worker/expansion.py), which the app installs
beside this transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Container, Sequence
from typing import Any, Protocol, cast

from aiokafka import codec
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.transport.drivers import aiokafka as driver
from faust.types import TP
from faust.types.tuples import Message
from mode.utils.futures import maybe_async
from mode.utils.objects import cached_property

from streams.faustapp import consumer as faustapp_consumer
from streams.faustapp.producer import IdempotentProducer
from streams.seams import aiokafka as aiokafka_seams
from streams.seams import faust as faust_seams
from streams.seams import mode as mode_seams

SCHEME = "loopwarden"
"""The broker URL scheme this transport is registered under."""

# Faust's own lines stay under the faust logger (held at --faust-loglevel);
# mode would otherwise name a subclass's logger after this module.
faust_log = logging.getLogger("faust.loopwarden.transport")


#: A held fetch is answered early once this much has arrived (about fifty
#: tool calls): by then it is worth its round trip.
HOLD_MIN_BYTES = 16 * 1024
#: How long an unheld fetch waits for its first record: Faust's wait.
LONG_POLL_MS = 1500


class FetchPacer:
    """Whether the broker should hold the fetches of events, from how fast they arrive.

    Faust's fetches ask for one byte: each is answered as soon as one record
    is there, so at a few hundred events a second nearly every fetch carries
    one or two, each paying for a fetch request, its response and a trip
    through the fetch loop. A held fetch (``HOLD_MIN_BYTES``, up to ``hold``)
    gathers what arrives meanwhile: less CPU per event, a longer median wait
    (bench/notes/2026-12-02-held-fetches.md). Idle, though, a held fetch comes back
    empty every ``hold``: so fetches are held only while events arrive at two
    or more per hold, and released below one per hold, measured over ``window``.
    """

    def __init__(self, hold: float, window: float = 0.25) -> None:
        self.hold = hold
        self.window = window
        self.held = False
        self._since: float | None = None
        self._count = 0

    def observe(self, records: int, now: float) -> bool | None:
        """Count ``records`` fetched at ``now`` (monotonic seconds); the new
        held state when this changes it, else None. Without a hold, nothing."""
        if self.hold <= 0:
            return None
        if self._since is None:
            self._since = now
        self._count += records
        elapsed = now - self._since
        if elapsed < self.window:
            return None
        per_hold = self._count / elapsed * self.hold
        self._since, self._count = now, 0
        held = per_hold >= 2 or (self.held and per_hold >= 1)
        if held == self.held:
            return None
        self.held = held
        return held


class Intake(Protocol):
    """Where the consumer hands the events topics' batches."""

    topics: Container[str]
    """The events topics (the worker's own and its tenants'), looked up per message."""

    def feed(self, messages: list[Message], polled_at: float) -> None:
        """Take a batch of fetched messages (synchronous: no await in between);
        ``polled_at``: when the consumer's poll returned them (``time.time()``)."""

    def room(self) -> Awaitable[None] | None:
        """None when more may be fed now, else an awaitable that waits for room."""

    def fetches_held(self, held: bool) -> None:
        """The consumer began (True) or stopped holding fetches (``FetchPacer``)."""


class LoopConsumer(mode_seams.LoopServiceThread, faustapp_consumer.ConsumerThread):
    """The aiokafka consumer on the app's own event loop, in the place of Faust's consumer thread.

    Faust runs aiokafka in a thread with an event loop of its own and asks it
    for every batch across the two loops. aiokafka sends no new fetch for a
    partition while records it fetched wait unread, so each ask-and-answer,
    and every moment the thread waits for the GIL, came on top of the fetch:
    the largest part of a verdict's wait beyond a bare consume → produce relay
    (bench/notes/2026-12-02-consumer-on-the-loop.md). Here the consumer is an ordinary
    service on the app's loop, as in such a relay: calls Faust would queue to
    the thread are awaited where they are made, and the rebalance callbacks
    reach the app through Faust's own method queue, which works the same on
    one loop.

    Its seek to the committed offsets is the shared one
    (``streams.faustapp.consumer.ConsumerThread``): a partition with nothing
    committed yet is sought to its beginning.
    """

    logger = faust_log
    #: When the last poll returned its records (time.time()).
    polled_at = 0.0

    def __init__(self, consumer: Any, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(consumer, loop=loop, thread_loop=loop, **kwargs)

    async def call_thread(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await maybe_async(fun(*args, **kwargs))

    def hold_fetches(self, hold: float) -> None:
        """Let the broker hold each fetch sent from now on up to ``hold``
        seconds to fill it (``FetchPacer``); 0: answer at the first record."""
        consumer = faust_seams.aiokafka_consumer(self)
        if hold > 0:
            aiokafka_seams.set_fetch_wait(consumer, HOLD_MIN_BYTES, max(1, round(hold * 1000)))
        else:
            aiokafka_seams.set_fetch_wait(consumer, 1, LONG_POLL_MS)

    def polled(self) -> None:
        self.polled_at = time.time()


class Consumer(faustapp_consumer.Consumer):
    """The shared corrected consumer (generation-checked acknowledgements,
    ``streams.faustapp.consumer``) with the batched intake."""

    logger = faust_log
    acked_since_commit = 0
    #: The consumer on the app's loop (``new_consumer_thread``).
    loop_consumer: LoopConsumer

    @cached_property
    def pacer(self) -> FetchPacer:
        return FetchPacer(getattr(self.app, "fetch_hold", 0.0))

    def new_consumer_thread(self) -> LoopConsumer:
        self.loop_consumer = LoopConsumer(self, loop=self.loop, beacon=self.beacon)
        return self.loop_consumer

    async def perform_seek(self) -> None:
        """Faust's seek to the committed offsets, with the fetch loop held until it is done.

        With the consumer on the app's loop, a fetch of partitions just
        resumed can return while the seek still waits for the broker; those
        records would be taken and then read again from the committed offset
        (from the beginning, for a partition with nothing committed yet). A
        fetch that returns while the flow is stopped is dropped by Faust and
        fetched again after the seek.
        """
        was_active = self.flow_active
        self.stop_flow()
        try:
            await super().perform_seek()
        finally:
            if was_active:
                self.resume_flow()

    def ack(self, message: Message) -> bool:
        """The shared ``ack``, counting the acknowledgements towards ``broker_commit_every``."""
        if super().ack(message):
            self.acked_since_commit += 1
            return True
        return False

    async def drain_messages(self, fetcher: Any) -> None:
        intake = cast(Intake | None, getattr(self.app, "intake", None))
        if intake is None:
            await super().drain_messages(fetcher)
        else:
            await self._drain_in_batches(fetcher, intake)

    async def _drain_in_batches(self, fetcher: Any, intake: Intake) -> None:
        """Faust's fetch loop, with the intake topics' messages handed over per batch."""
        topics = intake.topics
        deliver = self.callback
        read_offset = faust_seams.read_offsets(self)
        loop_consumer = self.loop_consumer
        acks_enabled_for = self.app.topics.acks_enabled_for
        track = self.track_message
        suspended = self.suspend_flow
        commit_every = self.app.conf.broker_commit_every
        pacer = self.pacer
        try:
            while not (self.should_stop or fetcher.should_stop):
                room = intake.room()
                if room is not None:
                    # Backpressure: fetch nothing more while the processor is
                    # full. (A rebalance cancels this task and starts it again.)
                    await room
                    continue
                await self.sleep(0)
                if self.should_stop:
                    break
                batch: list[Message] = []
                async for tp, message in self.getmany(timeout=1.0):
                    offset = message.offset
                    last = read_offset[tp]
                    if last is not None and offset < last:
                        continue  # fetched again after a seek: already taken
                    if last and offset - last > 1 and acks_enabled_for(message.topic):
                        # Offsets that never reach the stream (transaction
                        # markers, compaction) must not hold commits back.
                        await faust_seams.add_gap(self, tp, last + 1, offset)
                    if message.topic in topics:
                        # Tracked before it is fed: if a rebalance cancels this
                        # loop first, the batch is dropped, leaves Faust's (weak)
                        # tracking set unacknowledged, and is fetched again.
                        track(message)
                        batch.append(message)
                    else:
                        await self.wait_first(deliver(message), suspended.wait())
                    read_offset[tp] = offset
                if batch:
                    intake.feed(batch, loop_consumer.polled_at)
                held = pacer.observe(len(batch), time.monotonic())
                if held is not None:
                    loop_consumer.hold_fetches(pacer.hold if held else 0.0)
                    intake.fetches_held(held)
                if commit_every is not None and self.acked_since_commit >= commit_every:
                    self.acked_since_commit = 0
                    await self.commit()
        except (asyncio.CancelledError, *self.consumer_stopped_errors):
            if not self.transport.app.should_stop:
                raise  # a rebalance restarts the fetcher; anything else is a crash


class KeyPartitioner(DefaultPartitioner):
    """Kafka's default partition of a message, its key's murmur2 remembered.

    aiokafka hashes every key in Python, about 10 µs for a run id, and all
    of a run's verdicts share its key. Keyless messages go where the
    default partitioner sends them."""

    MAX_KEYS = 1 << 16
    """Keys remembered; when full the memory starts afresh (a dict of hashes, a few MB)."""

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return super().__call__(key, all_partitions, available)
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.MAX_KEYS:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


#: Changelog compression: name -> (whether its library is installed, aiokafka's code).
CODECS: dict[str, tuple[Callable[[], bool], int]] = {
    "zstd": (codec.has_zstd, aiokafka_seams.CODECS["zstd"]),
    "lz4": (codec.has_lz4, aiokafka_seams.CODECS["lz4"]),
    "snappy": (codec.has_snappy, aiokafka_seams.CODECS["snappy"]),
    "gzip": (codec.has_gzip, aiokafka_seams.CODECS["gzip"]),
    "none": (lambda: True, aiokafka_seams.CODECS["none"]),
}


def codec_for(name: str) -> int:
    """aiokafka's code for a compression name; ValueError saying what is missing."""
    if name not in CODECS:
        raise ValueError(f"unknown compression {name!r} (expected one of {', '.join(CODECS)})")
    installed, code = CODECS[name]
    if not installed():
        raise ValueError(f"{name} compression needs the cramjam package (pip install cramjam)")
    return code


class Producer(IdempotentProducer):
    """The worker's producer, which can also send records a batch at a time."""

    #: Uncompressed bytes in one batch of ``send_records`` while the worker
    #: keeps up (a larger record goes in a batch of its own). A verdict sent
    #: meanwhile may share a produce request with one such batch, so it
    #: waits for that batch's transfer and append: at 512 KiB the
    #: verdicts' p99 at 2,000 calls/s was half as long again
    #: (bench/notes/2026-12-03-changelog-batches-follow-the-load.md).
    records_batch_bytes = 64 * 1024
    #: The same while the worker is behind (``behind``): its verdicts wait in
    #: the backlog then, not behind a batch, and a checkpoint's states go in
    #: an eighth as many batches and produce requests
    #: (bench/notes/2026-12-03-changelog-batches-follow-the-load.md).
    records_batch_bytes_behind = 512 * 1024
    #: The delivery of the last batch ``send_records`` handed over: while
    #: the caller keeps up the next waits for it.
    _last_batch: asyncio.Future[tuple[TP, int]] | None = None

    @cached_property
    def records_codec(self) -> int:
        """The compression of ``send_records``' batches: the app's
        ``changelog_compression`` (the worker's ``--changelog-compression``), else none."""
        return codec_for(getattr(self.app, "changelog_compression", "none"))

    def _records_batch(self, behind: bool) -> aiokafka_seams.BatchBuilder:
        # Not ``create_batch``: its batches have the producer's size and compression.
        return aiokafka_seams.BatchBuilder(
            self.records_batch_bytes_behind if behind else self.records_batch_bytes, self.records_codec
        )

    async def send_records(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes]], *, behind: bool = False
    ) -> list[Awaitable[tuple[TP, int]]]:
        """Send ``records`` (key, value) to one partition in as few record
        batches as they fit (of ``records_batch_bytes``, or
        ``records_batch_bytes_behind`` if the caller is ``behind``); each
        awaitable gives the partition and the offset of its batch's last
        record once the broker has acknowledged it.

        One ``send`` a record cost a future, a partitioner call and the
        accumulator's bookkeeping each (a checkpoint's changelog records
        were about a third of all sends); a batch is built in aiokafka's C
        record builder. Not for transactions: the changelog is outside them.

        Unless ``behind``, a batch waits until the previous one (of any
        partition) is acknowledged: a produce request carries one at most,
        where a checkpoint's batches of every partition used to share one
        with the verdicts, and the checkpoint's slices spread over those
        round trips instead of running back to back, which held the next
        fetches (bench/notes/2026-12-04-one-changelog-batch-at-a-time.md).
        Behind, the verdicts wait in the backlog instead, and the batches
        go as fast as the producer takes them."""
        producer = faust_seams.aiokafka_producer(self)
        sent: list[Awaitable[tuple[TP, int]]] = []
        batch = self._records_batch(behind)
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full
                sent.append(await self._send_batch(producer, batch, topic, partition, behind))
                await asyncio.sleep(0)  # new events get their verdicts between two batches
                batch = self._records_batch(behind)
                batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
        if batch.record_count():
            sent.append(await self._send_batch(producer, batch, topic, partition, behind))
        return sent

    async def _send_batch(
        self, producer: Any, batch: Any, topic: str, partition: int, behind: bool
    ) -> Awaitable[tuple[TP, int]]:
        last = self._last_batch
        if not behind and last is not None and not last.done():
            await asyncio.wait((last,))  # its failure is the caller's to see, through its own awaitable
        count = batch.record_count()
        batch.close()
        # The sender builds (and compresses) the batch: the producer is
        # idempotent (IdempotentProducer), and stamps its id and sequence on a
        # batch before it is built.
        delivered = await producer.send_batch(batch, topic, partition=partition)

        async def last_offset() -> tuple[TP, int]:
            metadata = await delivered
            return TP(topic, partition), metadata.offset + count - 1

        self._last_batch = asyncio.ensure_future(last_offset())
        return self._last_batch


class Conductor(faust_seams.Conductor):
    """Faust's conductor, resubscribing a second after the topics change
    instead of 45 s: the worker adds a tenant's events topic when it finds
    it (streams/worker/tenants.py), all those found in one look at once, so
    there is nothing to coalesce, and a new tenant's first calls would
    otherwise wait out the 45 s."""

    resubscribe_delay = 1.0


class Transport(driver.Transport):
    """The aiokafka transport with the worker's conductor, consumer and producer."""

    Conductor = Conductor
    Consumer = Consumer
    Producer = Producer
