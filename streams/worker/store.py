"""The runs' state: the in-flight overlay in front of the runs table (a
``streams.faustapp.table.PartitionedTable``: RocksDB by partition, its
changelog, its TTL sweep), and the table's writes.

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
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import msgspec
from faust.types import TP

from schemas.codec import decode_stored, encode_stored
from schemas.state import RunState, StoredRun
from streams.faustapp.table import PartitionedTable
from streams.observability import logs
from streams.observability.metrics import WorkerMetrics
from streams.worker.checkpoint import Checkpoint, InFlight, Slot, Touched

log = logging.getLogger("loopwarden.worker")

#: A run's stored state must fit in one Kafka message (brokers refuse
#: messages over ~1 MB by default). Only pathological events (megabyte-long
#: tool names or error texts) come near it.
MAX_STATE_BYTES = 512 * 1024
#: State writes between two chances for the processor to take new events.
WRITES_PER_YIELD = 200


class RunStates(PartitionedTable):
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
        super().__init__(app, table)
        self.metrics = metrics
        #: Whether the worker is behind its events, asked once a slice: its
        #: changelog batches are larger then (``Producer.send_records``).
        self.behind = behind
        self.live: dict[Slot, InFlight] = {}

    def in_flight(self, partition: int, key: bytes) -> bool:
        return (partition, key) in self.live

    def held(self, partition: int, keys: int) -> None:
        self.metrics.runs_held(partition, keys)

    # -- the overlay ---------------------------------------------------------

    def load(self, slot: Slot) -> InFlight:
        """The run's state in flight, else read from the table (not yet in flight:
        ``hold`` puts it there once the engine has taken an event of it).

        The caller is about to change the state: if a closed checkpoint
        still has to write it as it is now, it is encoded for that checkpoint first."""
        entry = self.live.get(slot)
        if entry is None:
            return InFlight(self._read(slot))
        if entry.checkpoint is not None:
            entry.checkpoint.seal(slot, entry.stored, self._encode)
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
