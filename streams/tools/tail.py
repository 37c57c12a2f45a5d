"""``loopwarden tail``: print what arrives on the decision or dead-letter topic,
one JSON document per line (kafka-python, no Faust)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable
from typing import BinaryIO

from schemas import topics
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT, KafkaSecurity


def _header_map(headers: Iterable[tuple[str, bytes]] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in headers or ():
        found[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return found


def dead_letter_line(record) -> bytes:
    """One dead-lettered event as a JSON line: reason, source, original bytes."""
    headers = _header_map(record.headers)
    document: dict[str, object] = {
        "reason": headers.get(topics.HEADER_REASON),
        "kind": headers.get(topics.HEADER_KIND),
        "source": {
            "topic": headers.get(topics.HEADER_SOURCE_TOPIC),
            "partition": _int_or_none(headers.get(topics.HEADER_SOURCE_PARTITION)),
            "offset": _int_or_none(headers.get(topics.HEADER_SOURCE_OFFSET)),
        },
        "key": record.key.decode("utf-8", "replace") if record.key is not None else None,
    }
    value = record.value if record.value is not None else b""
    try:
        document["value"] = value.decode("utf-8")
    except UnicodeDecodeError:
        document["value_base64"] = base64.b64encode(value).decode()
    return json.dumps(document, ensure_ascii=False).encode() + b"\n"


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _consumer(bootstrap: str, security: KafkaSecurity):
    return kafka_clients.consumer(
        bootstrap,
        security=security,
        client_id="loopwarden-tail",
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        allow_auto_create_topics=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )


def tail(
    bootstrap: str,
    topic: str,
    out: BinaryIO,
    *,
    start: str = "latest",
    max_records: int | None = None,
    timeout: float | None = None,
    idle: float | None = None,
    deadletter: bool = False,
    dedupe: bool = False,
    stop=None,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Print records as they arrive, from `start` (earliest, latest, or a
    time or duration ago as `parse_since` reads it); returns how many were printed.

    Stops after ``max_records`` (counted after dedupe), after ``timeout``
    seconds in all, after ``idle`` seconds without a record, or when
    ``stop()`` returns true.
    """
    from kafka import TopicPartition
    from kafka.errors import TopicAuthorizationFailedError

    from streams.kafka.reader import read_refused
    from streams.tools.audit import parse_since
    from streams.kafka.topics import TopicNotAuthorized, describe_partitions

    started = time.monotonic()
    deadline = started + timeout if timeout is not None else None
    try:
        # The consumer only logs a topic it may not describe and finds no
        # partitions until the timeout; asking the admin API tells at once.
        describe_partitions(bootstrap, [topic], security=security)
    except TopicNotAuthorized:
        raise read_refused(topic, security) from None
    consumer = _consumer(bootstrap, security)
    printed = 0
    seen: set[tuple[str, int]] = set()
    try:
        partitions = None
        while not partitions:
            partitions = consumer.partitions_for_topic(topic)
            if partitions:
                break
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            time.sleep(0.2)
        assignment = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assignment)
        if start == "earliest":
            consumer.seek_to_beginning(*assignment)
        else:
            consumer.seek_to_end(*assignment)
            for tp in assignment:  # resolve "end" now, not at the first poll
                consumer.position(tp)
            if start != "latest":
                found = consumer.offsets_for_times({tp: parse_since(start) for tp in assignment})
                for tp, at in found.items():
                    if at is not None:
                        consumer.seek(tp, at.offset)
        last = time.monotonic()
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if idle is not None and now - last >= idle:
                break
            if stop is not None and stop():
                break
            wait = 0.2
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - now))
            batch = consumer.poll(timeout_ms=int(wait * 1000), max_records=5000)
            lines: list[bytes] = []
            for records in batch.values():
                for record in records:
                    if deadletter:
                        lines.append(dead_letter_line(record))
                    else:
                        value = record.value if record.value is not None else b"null"
                        if dedupe:
                            try:
                                verdict = json.loads(value)
                                ident = (verdict["run_id"], verdict["seq"])
                            except (ValueError, KeyError, TypeError):
                                ident = None
                            if ident is not None:
                                if ident in seen:
                                    continue
                                seen.add(ident)
                        lines.append(value + b"\n")
                    printed += 1
                    if max_records is not None and printed >= max_records:
                        break
                if max_records is not None and printed >= max_records:
                    break
            if lines:
                last = time.monotonic()
                out.write(b"".join(lines))
                out.flush()
            if max_records is not None and printed >= max_records:
                break
    except TopicAuthorizationFailedError:  # described, but not readable
        raise read_refused(topic, security) from None
    finally:
        consumer.close()
    return printed
