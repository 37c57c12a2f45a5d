"""The consumer's fetch loop, handing the events topic over in whole batches.

Faust delivers every fetched message on its own: two tasks to race the
delivery against a flow suspension, the conductor's lock, an Event object, a
channel queue, the stream iterator and its acknowledgement bookkeeping, about
400 µs of CPU per message on this project's benchmark machine, whatever the
agent does. Here the worker's consumer runs a loop of its own: each batch that
``Consumer.getmany`` returns (it stops early when the flow is suspended for a
rebalance and drops records of an older generation) is tracked for commits
exactly as Faust's loop tracks it and handed to the processor in one
synchronous call. Messages of every other topic (the table changelogs read
during recovery) go through Faust's own delivery, unchanged.

Acknowledgement stays Faust's: the processor calls ``Consumer.ack`` for each
message once it is finished, Faust commits acknowledged offsets, and a
rebalance waits (``wait_empty``) until every tracked message is acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import faust


class Sink(Protocol):
    def feed(self, messages: list[Any]) -> None:
        """Take a batch of fetched messages (synchronous: no await in between)."""

    def room(self) -> Awaitable[None] | None:
        """None when more may be fed now, else an awaitable that waits for room."""


def install(app: faust.App, topic: str, sink: Sink) -> None:
    """Make the app's consumer, when Faust creates it, feed ``topic`` to
    ``sink`` in batches. (Created any earlier, outside the worker, the
    consumer would not know about exactly_once transactions.)"""
    new_consumer = app._new_consumer

    def consumer_with_intake() -> Any:
        consumer = new_consumer()

        async def drain(fetcher: Any) -> None:
            await _drain(consumer, fetcher, topic, sink)

        consumer._drain_messages = drain
        return consumer

    app._new_consumer = consumer_with_intake  # type: ignore[method-assign]


async def _drain(consumer: Any, fetcher: Any, topic: str, sink: Sink) -> None:
    """Faust's fetch loop, with batches of ``topic`` handed to ``sink``."""
    deliver: Callable[[Any], Awaitable[Any]] = consumer.callback
    read_offset = consumer._read_offset
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    track = consumer.track_message
    suspended = consumer.suspend_flow
    stopped = consumer._stopped.is_set
    fetcher_stopped = fetcher._stopped.is_set
    commit_every = consumer._commit_every
    try:
        while not (stopped() or fetcher_stopped()):
            room = sink.room()
            if room is not None:
                # Backpressure: fetch nothing more while the processor is
                # full. (A rebalance cancels this task and starts it again.)
                await room
                continue
            await consumer.sleep(0)
            if consumer.should_stop:
                break
            batch: list[Any] = []
            async for tp, message in consumer.getmany(timeout=1.0):
                offset = message.offset
                last = read_offset[tp]
                if last is not None and offset < last:
                    continue  # fetched again after a seek: already taken
                if last and offset - last > 1 and acks_enabled_for(message.topic):
                    # Offsets that never reach the stream (transaction
                    # markers, compaction) must not hold commits back.
                    await consumer._add_gap(tp, last + 1, offset)
                if message.topic == topic:
                    # Tracked before it is fed: if a rebalance cancels this
                    # loop first, the batch is dropped, leaves Faust's (weak)
                    # tracking set unacknowledged, and is fetched again.
                    track(message)
                    batch.append(message)
                else:
                    await consumer.wait_first(deliver(message), suspended.wait())
                read_offset[tp] = offset
            if batch:
                sink.feed(batch)
            if commit_every is not None and consumer._n_acked >= commit_every:
                consumer._n_acked = 0
                await consumer.commit()
    except (asyncio.CancelledError, *consumer.consumer_stopped_errors):
        if not consumer.transport.app.should_stop:
            raise  # a rebalance restarts the fetcher; anything else is a crash
