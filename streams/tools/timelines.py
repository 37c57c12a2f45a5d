"""The dashboard's run timelines (`/explain`), bounded and cached.

A timeline is recomputed from the events and decisions topics, filtered by
the run's key. Read from the start of two large topics, one click cost a
minute and hundreds of MB. So a scan starts `window` seconds back (the
`--explain-window`), one scan runs at a time, and each answer is kept per
run (the last `CACHED_RUNS`) with the topics' end offsets it was read
against: asked again while neither topic has grown, it is served as it is.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import NamedTuple

from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from streams.kafka.clients import PLAINTEXT, KafkaSecurity

CACHED_RUNS = 200


class Timeline(NamedTuple):
    text: str
    found: bool
    """Whether the run had events in the window."""


class Timelines:
    """One timeline at a time, each kept until its topics grow."""

    def __init__(
        self,
        bootstrap: str,
        config: FleetConfig,
        policy: FleetPolicy | None,
        window: float,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self.policy = policy
        self.window = window
        self.security = security
        self.scans = 0
        self._cache: OrderedDict[tuple[str, str, str], tuple[dict[str, list[int]], Timeline]] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, run_id: str, events: str, decisions: str) -> Timeline:
        """The run's timeline; raises ReadError when the topics cannot be read."""
        from streams.tools.explain import explain_from_topics, format_timeline, topic_ends

        key = (events, decisions, run_id)
        async with self._lock:
            ends = await asyncio.to_thread(topic_ends, self.bootstrap, [events, decisions], self.security)
            cached = self._cache.get(key)
            if cached is not None and cached[0] == ends:
                self._cache.move_to_end(key)
                return cached[1]
            since_ms = int((time.time() - self.window) * 1000) if self.window > 0 else None
            steps, refused = await asyncio.to_thread(
                explain_from_topics,
                self.bootstrap,
                run_id,
                events,
                decisions,
                self.config,
                self.policy,
                self.security,
                since_ms,
            )
            self.scans += 1
            timeline = Timeline(format_timeline(steps, run_id, refused, show_published=True), bool(steps))
            self._cache[key] = (ends, timeline)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHED_RUNS:
                self._cache.popitem(last=False)
            return timeline
