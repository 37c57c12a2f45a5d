"""The runs' state: Faust's RocksDB table addressed by partition, the
in-flight overlay in front of it, and the TTL sweep.

A run's newest state lives in the overlay from the event that changed it
until the checkpoint holding that change has written it to the table (and
its changelog); later events of the run read it there. The table is
written only by checkpoints (streams/worker/checkpoint.py), after the
verdicts it implies were acknowledged by the broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import faust
import msgspec
from faust.types import TP
from rocksdict import WriteBatch, WriteOptions

from schemas.codec import decode_stored, encode_stored, touched_at
from schemas.state import RunState, StoredRun
from streams.observability import logs
from streams.observability.metrics import WorkerMetrics
from streams.worker.seams import faust as faust_seams

if TYPE_CHECKING:
    from streams.worker.checkpoint import Checkpoint, Touched

log = logging.getLogger("loopwarden.worker")

STORE_URL = "loopwarden://"
"""The runs table's store: ``RunStore``, registered under this scheme (the
``faust.stores`` entry point in pyproject.toml)."""

#: A run's stored state must fit in one Kafka message (brokers refuse
#: messages over ~1 MB by default). Only pathological events (megabyte-long
#: tool names or error texts) come near it.
MAX_STATE_BYTES = 512 * 1024
#: State writes between two chances for the processor to take new events.
WRITES_PER_YIELD = 200

#: The run table's write options: no write-ahead log. A slice's write took
#: a third of the time (bench/state_writes.py), with the GIL held throughout.
UNLOGGED = WriteOptions()
UNLOGGED.disable_wal = True

partition_db = faust_seams.partition_db

Slot = tuple[int, bytes]
"""(partition, run key): where a run's state lives."""


class RunStore(faust_seams.Store):
    """Faust's RocksDB store, read and written by partition.

    Faust's store picks a partition's database from the task-local *current
    event*; the worker takes events of many partitions in one task, so each
    access names its partition (``partition_db``, the base class's own way to
    reach and, as for its own reads, open one partition's database).

    Every write skips RocksDB's write-ahead log (``UNLOGGED``, set on each
    database as it is opened):
    the changelog topic is the table's log. Faust's own writes (recovery,
    the persisted changelog offset) skip it too, so after a crash a database
    is as it was at its last flush, states and offset alike, and recovery
    replays the changelog from there (docs/PROCESSING.md).
    """

    # Faust's own lines stay under the faust logger (held at --faust-loglevel);
    # mode would otherwise name a subclass's logger after this module.
    logger = logging.getLogger("faust.loopwarden.store")

    def opened(self, db: Any) -> Any:
        db.set_write_options(UNLOGGED)
        return db

    def get_in(self, partition: int, key: bytes) -> bytes | None:
        return partition_db(self, partition).get(key)

    def write_in(self, partition: int, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Put many values in one RocksDB write: one log record for all of
        them, where a put each cost about twice the CPU (bench/README.md)."""
        batch = WriteBatch(raw_mode=True)  # the store opens its databases in raw mode
        for key, value in items:
            batch.put(key, value)
        partition_db(self, partition).write(batch)

    def delete_in(self, partition: int, key: bytes) -> None:
        partition_db(self, partition).delete(key)

    def items_in(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of one partition's database, without Faust's offset record."""
        offset_key = self.offset_key
        return ((k, v) for k, v in partition_db(self, partition).items() if k != offset_key)


class InFlight:
    """A run's newest state, and the last checkpoint that took an event of it."""

    __slots__ = ("stored", "checkpoint")

    def __init__(self, stored: StoredRun, checkpoint: Checkpoint | None = None) -> None:
        self.stored = stored
        self.checkpoint = checkpoint


class RunStates:
    """The in-flight overlay over the runs table, the table's writes and its TTL sweep.

    A write puts the value into the partition's RocksDB and sends it to the
    table's changelog topic on the same partition. The changelog records go
    to the producer a record batch at a time (``Producer.send_records``)
    rather than through ``table[key] = value``, whose buffer is drained one
    message at a time and, above 100 waiting messages, stalls the consumer;
    the changelog offset is recorded in RocksDB on acknowledgement exactly as
    Faust does, so recovery resumes from it.
    """

    def __init__(
        self, app: faust.App, table: Any, metrics: WorkerMetrics, behind: Callable[[], bool] = lambda: False
    ) -> None:
        self.app = app
        self.table = table
        self.metrics = metrics
        #: Whether the worker is behind its events, asked once a slice: its
        #: changelog batches are larger then (``Producer.send_records``).
        self.behind = behind
        self.live: dict[Slot, InFlight] = {}
        self._changelog: str | None = None

    @property
    def store(self) -> RunStore:
        return self.table.data

    @property
    def changelog(self) -> str:
        if self._changelog is None:
            self._changelog = self.table.changelog_topic_name
        return self._changelog

    # -- the overlay ---------------------------------------------------------

    def load(self, slot: Slot) -> InFlight:
        """The run's state in flight, else read from the table (not yet in flight:
        ``hold`` puts it there once the engine has taken an event of it).

        The caller is about to change the state: if a closed checkpoint
        still has to write it as it is now, it is encoded for that checkpoint first."""
        entry = self.live.get(slot)
        if entry is None:
            return InFlight(self._read(slot))
        checkpoint = entry.checkpoint
        if checkpoint is not None and checkpoint.closed:
            touched = checkpoint.touched.get(slot)
            if touched is not None and touched.dirty and touched.sealed is None:
                touched.sealed = self._encode(slot[1], entry.stored)
        return entry

    def hold(self, slot: Slot, entry: InFlight, checkpoint: Checkpoint) -> None:
        """Keep ``entry`` in flight until ``checkpoint`` (or a later one) writes it."""
        entry.checkpoint = checkpoint
        self.live[slot] = entry

    def _read(self, slot: Slot) -> StoredRun:
        partition, key = slot
        data = self.store.get_in(partition, key)
        if data is None:
            return StoredRun(0.0, RunState())
        try:
            return decode_stored(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Not written by this version: start the run afresh rather than
            # stop every run of the partition behind it.
            self.metrics.states_unreadable.inc()
            logs.event(
                log,
                logging.ERROR,
                "stored run state unreadable; starting the run afresh",
                event="state_unreadable",
                run_id=key.decode("utf-8", "replace")[:200],
                error=str(exc)[:200],
            )
            return StoredRun(0.0, RunState())

    # -- writes (called by the checkpoint) -------------------------------------

    def _encode(self, key: bytes, stored: StoredRun) -> bytes:
        """The stored run's bytes, touched now; a state that cannot be stored
        (too large for one message) keeps only its last seq, so the worker
        never stalls on one pathological run."""
        stored.touched = time.time()
        try:
            data = encode_stored(stored)
            if len(data) <= MAX_STATE_BYTES:
                return data
            problem = f"{len(data)} bytes (limit {MAX_STATE_BYTES})"
        except (OverflowError, TypeError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        self.metrics.states_reset.inc()
        logs.event(
            log,
            logging.ERROR,
            "run state cannot be stored; keeping only its last seq",
            event="state_reset",
            run_id=key.decode("utf-8", "replace")[:200],
            problem=problem,
        )
        stored.state = RunState(last_seq=stored.state.last_seq)
        return encode_stored(stored)

    async def write(self, checkpoint: Checkpoint) -> list[Awaitable[tuple[TP, int]]]:
        """Write the states the checkpoint changed, a slice of a partition's
        at a time: encoded (unless sealed already), put in one RocksDB write
        and sent to the changelog, with a yield after each slice. Return the
        sends' awaitables. A slice's runs that no later checkpoint took an
        event of leave the overlay once it is written (the table has them
        now), and the checkpoint lets go of them, so their decoded states are
        freed slice by slice rather than all at once with the checkpoint."""
        by_partition: dict[int, list[Slot]] = {}
        for slot in checkpoint.touched:
            by_partition.setdefault(slot[0], []).append(slot)
        written = []
        for partition, slots in by_partition.items():
            for start in range(0, len(slots), WRITES_PER_YIELD):
                chunk = [(slot, checkpoint.touched.pop(slot)) for slot in slots[start : start + WRITES_PER_YIELD]]
                items = [(slot[1], self._bytes_of(slot, touched)) for slot, touched in chunk if touched.dirty]
                if items:
                    self.store.write_in(partition, items)
                    written += await self.app.producer.send_records(
                        self.changelog, partition, items, behind=self.behind()
                    )
                self._release(checkpoint, chunk)
                del chunk, items
                await asyncio.sleep(0)  # new events get their verdicts meanwhile
        return written

    def _bytes_of(self, slot: Slot, touched: Touched) -> bytes:
        """A state as its checkpoint left it: sealed by a later event, or else
        unchanged since (no event of the run came after the checkpoint)."""
        return touched.sealed if touched.sealed is not None else self._encode(slot[1], touched.run.stored)

    def _release(self, checkpoint: Checkpoint, chunk: list[tuple[Slot, Touched]]) -> None:
        live = self.live
        for slot, touched in chunk:
            entry = touched.run
            if entry.checkpoint is checkpoint:
                # The entry and the checkpoint refer to each other: without
                # this the whole checkpoint (events, states, send futures)
                # would wait for the cyclic collector, whose passes over that
                # much held the event loop for tens of ms.
                entry.checkpoint = None
                if live.get(slot) is entry:
                    del live[slot]

    def persist(self, records: Sequence[tuple[TP, int]]) -> None:
        """Record how far the changelog holds what the table holds ((partition,
        offset) of acknowledged changelog records): recovery resumes from
        there, as from Faust's own writes. Once per partition, at its highest offset."""
        highest: dict[TP, int] = {}
        for tp, offset in records:
            if offset > highest.get(tp, -1):
                highest[tp] = offset
        for tp, offset in highest.items():
            if self.app.in_transaction:
                self.app.tables.persist_offset_on_commit(self.store, tp, offset)
            else:
                self.store.set_persisted_offset(tp, offset)

    def _persist_tombstone(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            record = future.result()
            self.persist([(record.topic_partition, record.offset)])  # a failed one is sent again by a later sweep

    # -- the TTL sweep ---------------------------------------------------------

    def active_partitions(self) -> list[int]:
        """Changelog partitions this worker owns as active (not standby)."""
        changelog = self.changelog
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == changelog)

    def _owns(self, partition: int) -> bool:
        return not self.app.rebalancing and TP(self.changelog, partition) in self.app.assignor.assigned_actives()

    async def sweep(self, ttl: float) -> int:
        """Expire runs idle longer than ``ttl`` in partitions this worker owns
        as active (never standbys, never while rebalancing); how many expired.
        The runs each partition still holds go to the metrics' active runs."""
        if self.app.rebalancing:
            return 0
        cutoff = time.time() - ttl
        expired = 0
        for partition in self.active_partitions():
            held = 0
            for seen, (key, value) in enumerate(self.store.items_in(partition), 1):
                held += 1
                if seen % 1024 == 0:
                    await asyncio.sleep(0)  # a large table does not hold up the processor
                    if not self._owns(partition):
                        break
                try:
                    recent = touched_at(value) >= cutoff
                except (msgspec.DecodeError, msgspec.ValidationError):
                    recent = False  # unreadable: expire it like an idle run
                if recent or (partition, key) in self.live:
                    continue  # recent, or in flight right now
                if await self._expire(partition, key, cutoff):
                    expired += 1
                    held -= 1
            self.metrics.runs_held(partition, held)
            await asyncio.sleep(0)
        return expired

    async def _expire(self, partition: int, key: bytes, cutoff: float) -> bool:
        """Delete a run idle since before ``cutoff`` (re-checked right before
        deleting, with no await in between) and send its changelog tombstone
        to the same partition."""
        if not self._owns(partition):
            return False  # revoked while the sweep waited for a send
        current = self.store.get_in(partition, key)
        if current is None:
            return False
        try:
            if touched_at(current) >= cutoff:
                return False
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        self.store.delete_in(partition, key)
        sent = await self.app.producer.send(self.changelog, key, None, partition, None, None)
        sent.add_done_callback(self._persist_tombstone)
        return True
