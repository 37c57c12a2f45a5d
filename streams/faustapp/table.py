"""The table store of every loopwarden Faust app: Faust's RocksDB store
addressed by partition, and a table of bytes written by partition with its
changelog and its idle sweep, which the worker's runs table
(streams/worker/store.py) and the fleet stage's tallies (streams/fleet/tallies.py) extend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import faust
import msgspec
from faust.types import TP
from rocksdict import WriteBatch, WriteOptions

from schemas.codec import touched_at
from streams.seams import faust as faust_seams

STORE_URL = "loopwarden://"
"""The tables' store: ``TableStore``, registered under this scheme (the
``faust.stores`` entry point in pyproject.toml)."""

#: The tables' write options: no write-ahead log. A slice's write took a
#: third of the time (bench/state_writes.py), with the GIL held throughout.
UNLOGGED = WriteOptions()
UNLOGGED.disable_wal = True

partition_db = faust_seams.partition_db


class TableStore(faust_seams.Store):
    """Faust's RocksDB store, read and written by partition.

    Faust's store picks a partition's database from the task-local *current
    event*; the worker takes events of many partitions in one task, so each
    access names its partition (``partition_db``, the base class's own way to
    reach and, as for its own reads, open one partition's database).

    Every write skips RocksDB's write-ahead log (``UNLOGGED``, set on each
    database as it is opened): the changelog topic is the table's log.
    Faust's own writes (recovery, the persisted changelog offset) skip it
    too, so after a crash a database is as it was at its last flush, values
    and offset alike, and recovery replays the changelog from there
    (docs/PROCESSING.md).
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
        them, where a put each cost about twice the CPU
        (bench/notes/2026-12-02-rocksdict-holds-the-gil.md)."""
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


class PartitionedTable:
    """A Faust table in a ``TableStore`` whose values begin with their
    touched time (``schemas.codec.touched_at``), as a stored run and a
    tally do: its changelog bookkeeping and the sweep that expires idle keys."""

    def __init__(self, app: faust.App, table: Any) -> None:
        self.app = app
        self.table = table
        self._changelog: str | None = None

    @property
    def store(self) -> TableStore:
        return self.table.data

    @property
    def changelog(self) -> str:
        if self._changelog is None:
            self._changelog = self.table.changelog_topic_name
        return self._changelog

    def in_flight(self, partition: int, key: bytes) -> bool:
        """Whether a newer value than the store's is on its way: never expired."""
        return False

    def held(self, partition: int, keys: int) -> None:
        """What a sweep found a partition holds once it is done with it."""

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
        """Changelog partitions this process owns as active (not standby)."""
        changelog = self.changelog
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == changelog)

    def _owns(self, partition: int) -> bool:
        return not self.app.rebalancing and TP(self.changelog, partition) in self.app.assignor.assigned_actives()

    async def sweep(self, ttl: float) -> int:
        """Expire keys idle longer than ``ttl`` in partitions this process owns
        as active (never standbys, never while rebalancing); how many expired.
        What each partition still holds goes to ``held``."""
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
                    recent = False  # unreadable: expire it like an idle key
                if recent or self.in_flight(partition, key):
                    continue
                if await self._expire(partition, key, cutoff):
                    expired += 1
                    held -= 1
            self.held(partition, held)
            await asyncio.sleep(0)
        return expired

    async def _expire(self, partition: int, key: bytes, cutoff: float) -> bool:
        """Delete a key idle since before ``cutoff`` (re-checked right before
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
