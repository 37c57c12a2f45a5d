"""Reading ranges of topics without a consumer group: the reader of `audit`,
`explain`, `tail` and the dashboard. It never joins a group, so the live
workers' group, offsets and assignment are never touched."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from streams.kafka import clients as kafka_clients
from streams.kafka.clients import KafkaSecurity
from streams.kafka.topics import missing_topic


class ReadError(RuntimeError):
    """A topic could not be read: the brokers unreachable, the topic missing or
    refused by the ACLs, or no progress; the message says which."""


class Record(NamedTuple):
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes


#: How long the brokers may hold a reader's fetch for data.
FETCH_WAIT_MS = 100


@contextlib.contextmanager
def kafka_refusals() -> Iterator[None]:
    """A read the brokers refuse (an ACL, a topic gone) as a ReadError
    naming it, not a traceback."""
    from kafka.errors import KafkaError

    try:
        yield
    except KafkaError as exc:
        raise ReadError(kafka_clients.describe_error(exc)) from None


def read_refused(topic: str, security: KafkaSecurity) -> ReadError:
    """A read the ACLs refuse, as audit, explain and tail report it."""
    return ReadError(kafka_clients.not_authorized(f"read topic {topic}", security))


class TopicReader:
    """Ranges of topics read by manual assignment (`group_id=None`: it never
    joins, rebalances or commits), for audit, explain and the dashboard.

    The brokers refuse a read the ACLs do not allow only in a fetch, and a
    range with nothing in it is never fetched: so a topic is fetched once
    from its end when its first range to read is empty. Without that, a user
    who may not read an empty topic was told that all 0 of its verdicts
    matched. Every refusal becomes `read_refused`."""

    def __init__(self, bootstrap: str, client_id: str, security: KafkaSecurity) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self._readable: set[str] = set()  # topics a fetch has been answered for
        try:
            self.consumer = kafka_clients.consumer(
                bootstrap,
                security=security,
                client_id=client_id,
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=FETCH_WAIT_MS,
                max_partition_fetch_bytes=4 * 1024 * 1024,
            )
        except Exception as exc:
            raise ReadError(f"cannot reach Kafka at {bootstrap}: {kafka_clients.describe_error(exc)}") from None

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    def partitions(self, topic: str) -> list[Any]:
        from kafka import TopicPartition

        parts = self.consumer.partitions_for_topic(topic)
        if not parts:
            raise ReadError(missing_topic(topic, self.bootstrap))
        return [TopicPartition(topic, p) for p in sorted(parts)]

    def beginnings(self, tps: list[Any]) -> dict[Any, int]:
        return dict(self.consumer.beginning_offsets(tps))

    def ends(self, tps: list[Any]) -> dict[Any, int]:
        return dict(self.consumer.end_offsets(tps))

    def starts(self, tps: list[Any], start_ms: int | None) -> dict[Any, int]:
        """Offset of the first record at or after `start_ms` per partition (the
        end offset when there is none); the log start for None."""
        if start_ms is None:
            return self.beginnings(tps)
        found = self.consumer.offsets_for_times({tp: max(0, start_ms) for tp in tps})
        ends = self.ends(tps)
        return {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in tps}

    def whole(self, topic: str) -> Iterator[Record]:
        """Every record the topic holds now, partition by partition."""
        tps = self.partitions(topic)
        return self.read(self.beginnings(tps), self.ends(tps))

    def read(
        self, starts: dict[Any, int], ends: dict[Any, int], key: bytes | None = None, idle_timeout: float = 30.0
    ) -> Iterator[Record]:
        """Every record from `starts` up to (not including) `ends`; with `key`,
        only that key's records (filtered before decoding)."""
        from kafka.errors import TopicAuthorizationFailedError

        todo = [tp for tp in starts if starts[tp] < ends[tp]]
        try:
            if todo:
                yield from self._records(todo, starts, ends, key, idle_timeout)
            elif starts:
                self._fetch_at_end(list(starts))
        except TopicAuthorizationFailedError:
            raise read_refused(next(iter(starts)).topic, self.security) from None

    def _fetch_at_end(self, tps: list[Any]) -> None:
        """Once per topic, unless a read has already been answered for it."""
        if tps[0].topic in self._readable:
            return
        consumer = self.consumer
        consumer.assign(tps)
        consumer.seek_to_end(*tps)
        try:
            consumer.poll(timeout_ms=FETCH_WAIT_MS * 3, max_records=1)
        finally:
            consumer.unsubscribe()
        self._readable.add(tps[0].topic)

    def _records(
        self, todo: list[Any], starts: dict[Any, int], ends: dict[Any, int], key: bytes | None, idle_timeout: float
    ) -> Iterator[Record]:
        consumer = self.consumer
        consumer.assign(todo)
        for tp in todo:
            consumer.seek(tp, starts[tp])
        pending = set(todo)
        last_progress = time.monotonic()
        while pending:
            batch = consumer.poll(timeout_ms=200, max_records=5000)
            for tp, records in batch.items():
                self._readable.add(tp.topic)
                for r in records:
                    if r.offset >= ends[tp]:
                        break
                    if key is None or r.key == key:
                        yield Record(tp.partition, r.offset, r.timestamp, r.key, r.value)
            if batch:
                last_progress = time.monotonic()
            for tp in list(pending):
                if consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
            if pending and time.monotonic() - last_progress > idle_timeout:
                raise ReadError(
                    f"no progress reading {sorted(f'{tp.topic}[{tp.partition}]' for tp in pending)} "
                    f"for {idle_timeout:.0f}s"
                )
