"""The events topic's producer: sends a run's events keyed by run id (so a
run lands on one partition, in order), and tells a check waiting on an event
that could not be sent."""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from schemas.events import Compaction, Event, RunEnd, ToolCall, ToolResult
from streams.kafka import clients as kafka_clients
from streams.client.waiters import Waiter
from streams.client.endpoint import Endpoint

log = logging.getLogger("loopwarden.client")
_encode = msgspec.json.encode


# The wire events, written without the fields left at their defaults (the
# worker reads those as absent): an event carries only what the gateway gave.
class WireToolCall(ToolCall, omit_defaults=True):
    pass


class WireToolResult(ToolResult, omit_defaults=True):
    pass


class WireCompaction(Compaction, omit_defaults=True):
    pass


class WireRunEnd(RunEnd, omit_defaults=True):
    pass


class Publisher:
    def __init__(self, endpoint: Endpoint, topic: str, extra_config: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.extra_config = extra_config
        self.producer: Any = None

    def start(self, timeout: float) -> None:
        """Connect, with sends that block at most `timeout` seconds for metadata."""
        config: dict[str, Any] = {
            "client_id": self.endpoint.client_id,
            "linger_ms": 0,
            "max_block_ms": max(100, int(timeout * 1000)),
            "retries": 5,
            # A known protocol version: the constructor then does not block
            # probing the broker, so a gateway starts even while Kafka is down
            # (its checks follow the policy until Kafka is back).
            "api_version": (3, 0),
            "reconnect_backoff_max_ms": 2000,  # back within ~2 s of the broker
        }
        config.update(self.extra_config)
        endpoint = self.endpoint
        self.producer = kafka_clients.producer(endpoint.bootstrap_servers, security=endpoint.security, **config)

    def send(self, event: Event, waiter: Waiter | None) -> None:
        producer = self.producer
        run_id, seq = event.run_id, event.seq
        if producer is None:
            self._failed(run_id, seq, waiter, "client not started")
            return
        try:
            future = producer.send(self.topic, key=run_id.encode(), value=_encode(event))
        except Exception as exc:  # KafkaTimeoutError when metadata is unavailable, etc.
            self._failed(run_id, seq, waiter, f"{type(exc).__name__}: {exc}")
            return
        self.endpoint.stats["published"] += 1
        future.add_errback(lambda exc: self._failed(run_id, seq, waiter, f"{type(exc).__name__}: {exc}"))

    def _failed(self, run_id: str, seq: int, waiter: Waiter | None, error: str) -> None:
        self.endpoint.stats["publish_failed"] += 1
        log.warning("loopwarden: cannot publish event run=%s seq=%s: %s", run_id, seq, error)
        if waiter is not None:
            waiter.fail(f"publish_failed: {error}")

    def partitions(self, topic: str) -> set[int]:
        """A topic's partitions, asked through the producer, whose wait is
        bounded by ``max_block_ms``: a consumer's own lookup waits without a
        bound, so with Kafka down a reader would never see ``close()``."""
        from kafka.errors import KafkaTimeoutError

        producer = self.producer
        if producer is None:
            raise RuntimeError("client closed")
        try:
            partitions = producer.partitions_for(topic)
        except KafkaTimeoutError:
            partitions = None
        if not partitions:
            raise RuntimeError(f"topic {topic} not found, or Kafka unreachable")
        return partitions

    def flush(self, timeout: float | None) -> None:
        if self.producer is not None:
            self.producer.flush(timeout=timeout)

    def close(self, timeout: float) -> None:
        """Flush what is pending, then close; never raises on a dead broker."""
        if self.producer is None:
            return
        try:
            self.producer.flush(timeout=timeout)
        except Exception as exc:  # closing must not raise on a dead broker
            log.warning("loopwarden: flush on close failed: %s", exc)
        self.producer.close(timeout=timeout)
        self.producer = None
