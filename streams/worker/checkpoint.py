"""Checkpoints: events taken in a row, finished together, in one order.

1. the verdicts and dead letters they produced are acknowledged by the
   broker (acks=all);
2. the run states they left are written to the table and its changelog,
   and the changelog acknowledges them;
3. the events are acknowledged to Faust, whose offset commits follow.

No durable record gets ahead of the published verdicts, so a crash anywhere
makes Kafka redeliver events whose verdicts are recomputed byte for byte
(docs/PROCESSING.md says why this is enough). While one checkpoint waits for
its acknowledgements the processor goes on into the next, so waiting for the
broker costs latency, not throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from faust.types import TP
from faust.types.tuples import Message

from schemas.state import StoredRun

#: Events acknowledged between two chances for the processor to take new ones.
ACKS_PER_YIELD = 200


Slot = tuple[int, bytes]
"""(partition, run key): where a run's state lives."""


class InFlight:
    """A run's newest state, and the last checkpoint that took an event of it."""

    __slots__ = ("stored", "checkpoint")

    def __init__(self, stored: StoredRun, checkpoint: Checkpoint | None = None) -> None:
        self.stored = stored
        self.checkpoint = checkpoint


class Touched:
    """A run a checkpoint took events of: its entry in flight, whether any of
    those events changed its state (a duplicate does not), and that state's
    bytes once sealed (encoded before a later event changes it)."""

    __slots__ = ("run", "dirty", "sealed")

    def __init__(self, run: InFlight) -> None:
        self.run = run
        self.dirty = False
        self.sealed: bytes | None = None


class Checkpoint:
    """Events taken in a row and everything they must wait for."""

    __slots__ = ("messages", "sent", "touched", "closed", "started", "size")

    def __init__(self) -> None:
        self.started = 0.0  # perf_counter() when its first event joined
        self.messages: list[Message] = []  # not acknowledged yet
        self.sent: list[Awaitable[Any]] = []  # verdict and dead-letter sends
        self.touched: dict[Slot, Touched] = {}
        self.closed = False  # no event joins it any more; its states are as it left them
        self.size = 0  # events taken, once closed

    def touch(self, slot: Slot, run: InFlight) -> Touched:
        touched = self.touched.get(slot)
        if touched is None:
            touched = self.touched[slot] = Touched(run)
        return touched

    def seal(self, slot: Slot, stored: StoredRun, encode: Callable[[bytes, StoredRun], bytes]) -> None:
        """Once closed, keep the bytes of a run's state as this checkpoint left
        it, before a later event changes it (`stored`: that state, `encode`:
        how the store turns it into bytes)."""
        if not self.closed:
            return
        touched = self.touched.get(slot)
        if touched is not None and touched.dirty and touched.sealed is None:
            touched.sealed = encode(slot[1], stored)


class States(Protocol):
    """The state store as a checkpoint sees it (streams.worker.store.RunStates)."""

    async def write(self, checkpoint: Checkpoint) -> list[Awaitable[tuple[TP, int]]]:
        """Write the states the checkpoint changed, as they were when it closed;
        what their changelog records' acknowledgements give: (partition,
        offset of a batch's last record)."""

    def persist(self, records: list[tuple[TP, int]]) -> None:
        """Record the changelog offsets the acknowledged records reached."""


async def finish(checkpoint: Checkpoint, states: States, ack: Callable[[Message], Any]) -> None:
    """Verdicts acknowledged, then states written, then events acknowledged.
    A failure raises before anything later in the order happened.

    A checkpoint holds ~1,000 events at 2,000 calls/s: the sends are
    awaited one by one (most are done by then; gathering them
    held the processor ~0.5 ms) and the events acknowledged and let go
    ``ACKS_PER_YIELD`` at a time (all at once held it ~2-3 ms every
    checkpoint, the worker's longest wait at 2,000 calls/s: commit f1f76e9)."""
    # acks=all: the table never gets ahead of the published verdicts.
    for sent in checkpoint.sent:
        await sent
    checkpoint.sent.clear()
    written = await states.write(checkpoint)
    if written:
        # The changelog holds the states before the events are acknowledged,
        # so a worker that takes the partition over restores at least what
        # the committed offsets imply.
        states.persist(await asyncio.gather(*written))
    messages = checkpoint.messages
    while messages:
        for message in messages[:ACKS_PER_YIELD]:
            ack(message)
        del messages[:ACKS_PER_YIELD]
        if messages:
            await asyncio.sleep(0)  # new events get their verdicts meanwhile


class Checkpoints:
    """The open checkpoint, the closed ones waiting, and the task finishing them.

    A checkpoint closes ``flush_interval`` after its first event (a run
    touched again meanwhile is stored once) or when the processor finds it
    full. Its states are encoded as it left them: while it is written, a
    slice at a time, or earlier, by the store, when a later event is about
    to change one (``RunStates.load``). Encoding them all at the close held
    the processor 4-10 ms every checkpoint at 2,000 calls/s."""

    def __init__(
        self,
        states: States,
        ack: Callable[[Message], Any],
        flush_interval: float,
        finished: Callable[[Checkpoint], None],
    ) -> None:
        self.states = states
        self.ack = ack
        self.flush_interval = flush_interval
        self.finished = finished
        self.open = Checkpoint()
        self.closed: deque[Checkpoint] = deque()
        self._wake = asyncio.Event()  # the open checkpoint got its first event
        self._queued = asyncio.Event()  # a checkpoint was closed

    def join(self, message: Message) -> Checkpoint:
        """The open checkpoint, with ``message`` in it."""
        checkpoint = self.open
        checkpoint.messages.append(message)
        if len(checkpoint.messages) == 1:
            checkpoint.started = time.perf_counter()
            self._wake.set()
        return checkpoint

    def close(self) -> None:
        checkpoint, self.open = self.open, Checkpoint()
        checkpoint.closed = True
        checkpoint.size = len(checkpoint.messages)
        self.closed.append(checkpoint)
        self._queued.set()

    async def run(self) -> None:
        """Finish checkpoints in order, for as long as the worker runs; raises
        when one cannot be finished (none of its events was acknowledged)."""
        while True:
            if not self.closed:
                if not self.open.messages:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                gather_for = self.open.started + self.flush_interval - time.perf_counter()
                if gather_for > 0:
                    self._queued.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._queued.wait(), gather_for)
                    continue
                self.close()
            checkpoint = self.closed[0]
            await finish(checkpoint, self.states, self.ack)
            self.closed.popleft()
            self.finished(checkpoint)
