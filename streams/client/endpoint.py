"""What a client's producer and its decision reader share: where the brokers
are, how to reach them, the name they know the client by, and its counters."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from streams.kafka.clients import KafkaSecurity


@dataclass(frozen=True)
class Endpoint:
    bootstrap_servers: str | list[str]
    security: KafkaSecurity
    client_id: str
    stats: collections.Counter[str]
    """The client's own counters (GuardClient.stats), which both add to."""
