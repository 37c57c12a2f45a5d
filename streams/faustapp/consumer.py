"""Faust's aiokafka consumer with two corrections of its rebalance path,
which both loopwarden transports build on (the worker's,
streams/worker/transport.py, and the fleet stage's, streams/fleet/transport.py).

docs/PROCESSING.md ("Three Faust behaviours loopwarden corrects") tells how
each was found; the third, on the flow control, is ``streams.faustapp.app.FlowControl``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from faust.types import TP
from faust.types.tuples import Message

from streams.seams import faust as faust_seams

# Faust's own lines stay under the faust logger (held at --faust-loglevel);
# mode would otherwise name a subclass's logger after this module.
faust_log = logging.getLogger("faust.loopwarden.consumer")


class ConsumerThread(faust_seams.ConsumerThread):
    """Faust's aiokafka consumer thread, seeking uncommitted partitions to their beginning.

    When a fetch returns while the flow is suspended for a rebalance, Faust
    drops its records and seeks back to the committed offsets to fetch them
    again; but aiokafka's ``seek_to_committed`` does not move a partition
    whose committed offset is missing or 0, so for a partition nothing was
    committed for yet those records would be gone. Such partitions are
    sought to their beginning, which is what ``auto_offset_reset="earliest"``
    means for them.
    """

    logger = faust_log

    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = await super().seek_to_committed()
        uncommitted = [tp for tp, offset in committed.items() if not offset]
        if uncommitted:
            await self.seek_to_beginning(*uncommitted)
        return committed


class Consumer(faust_seams.Consumer):
    """Faust's aiokafka consumer with the thread above and generation-checked acknowledgements."""

    logger = faust_log

    def new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def ack(self, message: Message) -> bool:
        """Faust's ``ack``, ignoring messages fetched under an older consumer generation.

        Such a message reaches the stream after the rebalance, is skipped and
        acknowledged; its offset could then be committed before the same
        offset, fetched again, is processed. Every message this process
        handled under the old generation was acknowledged before the
        rebalance finished (Faust waits for that), so nothing is held back.
        """
        generation = getattr(message, "generation_id", None)  # absent on messages not from a fetch
        if generation is not None and generation != self.app.consumer_generation_id:
            return False
        return super().ack(message)
