"""Corrections to the installed Faust's rebalance path, applied once per process.

Each closes a way Faust could acknowledge (and so commit) an event that no
agent processed; docs/PROCESSING.md tells how each was found.
"""

from __future__ import annotations

from typing import Any

import faust


def harden_faust(app: faust.App) -> None:
    """Close two ways the installed Faust can acknowledge (and so commit)
    events that no agent processed. Both were reproduced with two workers
    joining one after the other while events were being produced.

    1. ``FlowControlEvent.resume()`` empties the agents' input queues every
       time it is called. After a rebalance that needs no table recovery,
       Faust resumes the flow once when recovery ends and again when the
       stream partitions are resumed; events fetched in between are dropped
       from the queue. For a partition with a committed offset the consumer
       seeks back and fetches them again, but aiokafka only seeks when the
       committed offset is above 0, so for a partition with no commit yet
       they are never fetched again, and the next commit passes over them.
       Here ``resume()`` only empties the queues when the flow really was
       suspended (which is when they can hold events of an old generation).
       Events fetched twice are harmless: the engine ignores a seq it has
       already seen.
    2. An event fetched under an older consumer generation reaches the stream
       after the rebalance, is skipped and acknowledged; the acknowledged
       offset can then be committed before the same offset, fetched again,
       is processed. Here acknowledgements of events of an older generation
       are ignored (every event this worker processed under the old
       generation was acknowledged before the rebalance finished: Faust
       waits for that).
    3. The consumer also drops records it fetched while the flow was
       suspended (during a rebalance) and then "seeks back to the committed
       offsets" to fetch them again; but aiokafka's ``seek_to_committed``
       does not move a partition whose committed offset is missing or 0, so
       for a partition nothing was committed for yet those records are
       gone. Here such partitions are sought to their beginning, which is
       what ``auto_offset_reset="earliest"`` means for them anyway.
    """
    flow = app.flow_control
    if not getattr(flow, "_loopwarden_hardened", False):
        original_resume = flow.resume

        def resume() -> None:
            if flow.is_active():
                return  # nothing was suspended: keep what is queued
            original_resume()

        flow.resume = resume  # type: ignore[method-assign]
        flow._loopwarden_hardened = True  # type: ignore[attr-defined]

    from faust.transport.consumer import Consumer

    if not getattr(Consumer, "_loopwarden_hardened", False):
        original_ack = Consumer.ack

        def ack(self: Any, message: Any) -> bool:
            generation = getattr(message, "generation_id", None)
            if generation is not None and generation != self.app.consumer_generation_id:
                return False  # fetched again under the current generation
            return original_ack(self, message)

        Consumer.ack = ack  # type: ignore[method-assign]
        Consumer._loopwarden_hardened = True  # type: ignore[attr-defined]

    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    if not getattr(AIOKafkaConsumerThread, "_loopwarden_hardened", False):

        async def seek_to_committed(self: Any) -> Any:
            consumer = self._ensure_consumer()

            async def seek() -> Any:
                committed = await consumer.seek_to_committed()
                uncommitted = [tp for tp, offset in committed.items() if not offset]
                if uncommitted:
                    await consumer.seek_to_beginning(*uncommitted)
                return committed

            return await self.call_thread(seek)

        AIOKafkaConsumerThread.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
        AIOKafkaConsumerThread._loopwarden_hardened = True  # type: ignore[attr-defined]
