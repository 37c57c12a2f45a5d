"""Every Kafka client the project makes is configured here: the gateway
client's, the tools', the broker probe's (kafka-python) and the worker's Faust
app (aiokafka underneath). How a client reaches and authenticates to the
brokers is decided in `connection` and `faust_connection` only, so transport
security is added in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Bootstrap = str | Sequence[str]


def connection(bootstrap: Bootstrap) -> dict[str, Any]:
    """What every kafka-python client needs to reach the brokers."""
    return {"bootstrap_servers": bootstrap}


def producer(bootstrap: Bootstrap, **options: Any) -> Any:
    """A kafka-python `KafkaProducer`; `options` are its own settings."""
    from kafka import KafkaProducer

    return KafkaProducer(**{**connection(bootstrap), **options})


def consumer(bootstrap: Bootstrap, **options: Any) -> Any:
    """A kafka-python `KafkaConsumer`; `options` are its own settings."""
    from kafka import KafkaConsumer

    return KafkaConsumer(**{**connection(bootstrap), **options})


def admin(bootstrap: Bootstrap, **options: Any) -> Any:
    """A kafka-python `KafkaAdminClient`; `options` are its own settings."""
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**{**connection(bootstrap), **options})


def faust_connection(bootstrap: str, transport: str = "kafka") -> dict[str, Any]:
    """The same for a Faust app's settings: its broker URLs, under the Faust
    transport `transport` (the worker's own is "loopwarden",
    streams/worker/transport.py)."""
    servers = [server.strip() for server in bootstrap.split(",") if server.strip()]
    return {"broker": ",".join(f"{transport}://{server}" for server in servers)}
