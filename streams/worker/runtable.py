"""The runs table: each run's stored state in Faust's RocksDB store, addressed
by (partition, run id), written by the worker itself together with its
changelog record (see docs/PROCESSING.md for why not through `table[key]`)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Iterable
from typing import Any

import faust
import msgspec
from faust.streams import _current_event  # task-local "event being processed"

from schemas.codec import touched_at


class _At:
    """Stands in for Faust's *current event* inside a ``with`` block: all the
    store reads from it is the partition. The block holds the object, as the
    context variable keeps only a weak reference."""

    __slots__ = ("message", "partition", "_token", "__weakref__")

    def __init__(self, partition: int) -> None:
        self.message = self  # the store asks for ``event.message.partition``
        self.partition = partition

    def __enter__(self) -> None:
        self._token = _current_event.set(weakref.ref(self))

    def __exit__(self, *exc_info: object) -> None:
        _current_event.reset(self._token)


class RunTable:
    """The runs table, addressed by (partition, run id).

    Faust's RocksDB store keeps one database per partition and picks it from
    the task-local *current event*; the worker takes events of several
    partitions at once, so each access names its partition explicitly. A write
    puts the value into the partition's RocksDB and sends it to the table's
    changelog topic on the same partition. The changelog message is sent
    straight to the producer rather than through ``table[key] = value``,
    whose buffer is drained one message at a time and, above 100 waiting
    messages, stalls the consumer; the changelog offset is recorded in RocksDB
    on acknowledgement exactly as Faust does, so recovery resumes from it.
    """

    def __init__(self, app: faust.App, table: Any) -> None:
        self.app = app
        self.table = table
        self._changelog: str | None = None

    @property
    def changelog(self) -> str:
        if self._changelog is None:
            self._changelog = self.table.changelog_topic_name
        return self._changelog

    def get(self, partition: int, key: bytes) -> bytes | None:
        with _At(partition):
            return self.table.data.get(key)

    async def put(self, partition: int, key: bytes, value: bytes) -> Awaitable[Any]:
        """Write locally, send to the changelog; returns the send's future."""
        with _At(partition):
            self.table.data[key] = value
        future = await self.app.producer.send(self.changelog, key, value, partition, None, None)
        future.add_done_callback(self._persist_offset)
        return future

    def _persist_offset(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # the finisher sees the failure when it awaits the future
        metadata = future.result()
        if self.app.in_transaction:
            self.app.tables.persist_offset_on_commit(self.table.data, metadata.topic_partition, metadata.offset)
        else:
            self.table.data.set_persisted_offset(metadata.topic_partition, metadata.offset)

    def active_partitions(self) -> list[int]:
        """Changelog partitions this worker owns as active (not standby)."""
        changelog = self.changelog
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == changelog)

    def scan(self, partition: int) -> Iterable[tuple[bytes, bytes]]:
        """(key, value) of one active partition's database (no Faust bookkeeping key)."""
        store = self.table.data
        db = store._dbs.get(partition)  # only databases already open for this worker
        if db is None:
            return ()
        offset_key = store.offset_key
        return ((k, v) for k, v in db.items() if k != offset_key)

    async def expire(self, partition: int, key: bytes, cutoff: float) -> bool:
        """Delete a run idle since before ``cutoff`` from one partition's
        database (re-checked right before deleting, with no await in
        between) and send its changelog tombstone to the same partition."""
        store = self.table.data
        db = store._dbs.get(partition)
        if db is None:
            return False
        current = db.get(key)
        if current is None:
            return False
        try:
            if touched_at(current) >= cutoff:
                return False
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        db.delete(key)
        store._key_index.pop(key, None)
        future = await self.app.producer.send(self.changelog, key, None, partition, None, None)
        future.add_done_callback(self._persist_offset)
        return True
