"""Every Kafka client the project makes is configured here: the gateway
client's, the tools', the broker probe's and the tests' (kafka-python), the
benchmarks' (aiokafka) and the worker's Faust app (aiokafka underneath). How a
client reaches and authenticates to the brokers is decided in `connection` and
`faust_connection` only, so transport security is added in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Bootstrap = str | Sequence[str]


def connection(bootstrap: Bootstrap) -> dict[str, Any]:
    """What every kafka-python and aiokafka client needs to reach the brokers
    (both name it `bootstrap_servers`)."""
    return {"bootstrap_servers": bootstrap}


def producer(bootstrap: Bootstrap, **options: Any) -> Any:
    """A kafka-python `KafkaProducer`; `options` are its own settings."""
    from kafka import KafkaProducer

    return KafkaProducer(**{**connection(bootstrap), **options})


def consumer(bootstrap: Bootstrap, *topics: str, **options: Any) -> Any:
    """A kafka-python `KafkaConsumer`, subscribed to `topics` if any;
    `options` are its own settings."""
    from kafka import KafkaConsumer

    return KafkaConsumer(*topics, **{**connection(bootstrap), **options})


def admin(bootstrap: Bootstrap, **options: Any) -> Any:
    """A kafka-python `KafkaAdminClient`; `options` are its own settings."""
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**{**connection(bootstrap), **options})


def aio_producer(bootstrap: Bootstrap, **options: Any) -> Any:
    """An aiokafka `AIOKafkaProducer` (not started); `options` are its own settings."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(**{**connection(bootstrap), **options})


def aio_consumer(bootstrap: Bootstrap, *topics: str, **options: Any) -> Any:
    """An aiokafka `AIOKafkaConsumer` (not started), subscribed to `topics`
    if any; `options` are its own settings."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(*topics, **{**connection(bootstrap), **options})


def faust_connection(bootstrap: str, transport: str = "kafka") -> dict[str, Any]:
    """The same for a Faust app's settings: its broker URLs, under the Faust
    transport `transport` (the worker's own is "loopwarden",
    streams/worker/transport.py)."""
    servers = [server.strip() for server in bootstrap.split(",") if server.strip()]
    return {"broker": ",".join(f"{transport}://{server}" for server in servers)}
