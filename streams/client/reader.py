"""The decision reader: one background thread reading the decisions topic by
manual assignment, positioned at the end (no consumer group, no commits: a
gateway only needs verdicts for events it publishes from now on), handing
each record to the client."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kafka.partitioner.default import murmur2

from streams.kafka import clients as kafka_clients
from streams.client.endpoint import Endpoint

log = logging.getLogger("loopwarden.client")


class DecisionReader:
    def __init__(
        self,
        endpoint: Endpoint,
        topic: str,
        extra_config: dict[str, Any],
        partitions: Callable[[str], set[int]],
        deliver: Callable[[bytes | None, bytes], None],
        reply_partition: int | None,
        instance_id: str | None,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.extra_config = extra_config
        self.partitions = partitions
        """A topic's partitions, with a bounded wait."""
        self.deliver = deliver
        self.reply_partition = reply_partition
        """The partition read (resolved from `instance_id` on the first read); None: all of them."""
        self.instance_id = instance_id
        self.thread: threading.Thread | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()

    def start(self) -> None:
        if self.thread is not None:
            return
        self._stop.clear()
        self.thread = threading.Thread(target=self._read, name="loopwarden-decisions", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to stop (`join` waits for it)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
            self.thread = None

    def _reply_partitions(self, partitions: set[int]) -> set[int]:
        """The partitions to read: the reply partition (resolved from the
        instance id the first time), else all of them."""
        if self.instance_id is not None and self.reply_partition is None:
            hashed = murmur2(self.instance_id.encode()) & 0x7FFFFFFF
            self.reply_partition = sorted(partitions)[hashed % len(partitions)]  # Kafka's partition for the key
        if self.reply_partition is None:
            return partitions
        if self.reply_partition not in partitions:
            raise ValueError(
                f"reply_partition {self.reply_partition} is not a partition of {self.topic} (it has {len(partitions)})"
            )
        return {self.reply_partition}

    def _read(self) -> None:
        from kafka import TopicPartition

        consumer = None
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if consumer is None:
                    config: dict[str, Any] = {
                        "client_id": f"{self.endpoint.client_id}-decisions",
                        "group_id": None,
                        "enable_auto_commit": False,
                        "fetch_max_wait_ms": 100,
                        "api_version": (3, 0),
                        "reconnect_backoff_max_ms": 2000,
                    }
                    config.update(self.extra_config)
                    partitions = self._reply_partitions(self.partitions(self.topic))
                    consumer = kafka_clients.consumer(
                        self.endpoint.bootstrap_servers, security=self.endpoint.security, **config
                    )
                    tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
                    consumer.assign(tps)
                    consumer.seek_to_end(*tps)
                    for tp in tps:
                        consumer.position(tp)  # resolve now: later verdicts are not missed
                    self.ready.set()
                    backoff = 0.2
                batch = consumer.poll(timeout_ms=100)
                for records in batch.values():
                    for record in records:
                        self.endpoint.stats["read_bytes"] += len(record.value or b"") + len(record.key or b"")
                        self.deliver(record.key, record.value)
            except Exception as exc:  # keep reading across broker outages
                if self._stop.is_set():
                    break
                log.warning("loopwarden: decision reader: %s: %s (retrying)", type(exc).__name__, exc)
                if consumer is not None and not self.ready.is_set():
                    consumer.close()
                    consumer = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                pass
