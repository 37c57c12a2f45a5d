"""``loopwarden produce``: publish a JSON-lines trace to a topic, keyed by run
id (kafka-python, no Faust).

Bad lines: by default ``produce`` validates every line with the same decoder
the worker uses, reports each bad line with its number on stderr, does not
send it, and exits 1 when any line was bad. ``--raw`` sends every non-blank
line verbatim (keyed by its ``run_id`` when one can be read), which is how
the dead-letter path is exercised.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO

import msgspec

from schemas.codec import BadEvent, decode_event
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT, KafkaSecurity
from streams.tools.progress import read_lines


@dataclass
class ProduceReport:
    """`sent`: acknowledged by the broker; `refused`: bad lines not sent;
    `failed`: sent but not acknowledged (e.g. refused by an ACL), the first
    such error in `error`."""

    sent: int = 0
    refused: int = 0
    failed: int = 0
    error: str | None = None


def _producer(bootstrap: str, security: KafkaSecurity, *, linger_ms: int = 5):
    return kafka_clients.producer(
        bootstrap,
        security=security,
        client_id="loopwarden-produce",
        acks="all",
        linger_ms=linger_ms,
        batch_size=256 * 1024,
        allow_auto_create_topics=False,
        max_request_size=8 * 1024 * 1024,
    )


def _loose_run_id(line: bytes) -> str | None:
    """run_id of a line that may not be a valid event (for --raw keys)."""
    try:
        document = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(document, dict) and isinstance(document.get("run_id"), str) and document["run_id"]:
        return document["run_id"]
    return None


def keyed_lines(lines: Iterable[bytes], *, raw: bool, err: TextIO) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) per line to send; bad lines reported (and, unless raw, skipped)."""
    for number, line in enumerate(lines, 1):
        value = line.rstrip(b"\r\n")
        if not value.strip():
            continue
        if raw:
            run_id = _loose_run_id(value)
            yield (run_id.encode() if run_id is not None else None), value
            continue
        try:
            event = decode_event(value)
        except BadEvent as exc:
            err.write(f"line {number}: {exc}\n")
            yield None, b""  # marker: refused
            continue
        yield event.run_id.encode(), value


def produce(
    lines: Iterable[bytes],
    bootstrap: str,
    topic: str,
    *,
    raw: bool = False,
    err: TextIO = sys.stderr,
    producer=None,
    security: KafkaSecurity = PLAINTEXT,
) -> ProduceReport:
    """Send a trace and wait until the broker has answered every message."""
    report = ProduceReport()
    own = producer is None
    producer = producer or _producer(bootstrap, security)
    try:
        futures = []
        for key, value in keyed_lines(lines, raw=raw, err=err):
            if not value:
                report.refused += 1
                continue
            futures.append(producer.send(topic, key=key, value=value))
        producer.flush()
        for future in futures:
            if future.failed():
                report.failed += 1
                report.error = report.error or kafka_clients.describe_error(future.exception)
            else:
                report.sent += 1
    finally:
        if own:
            producer.close()
    return report


def produce_file(
    path: str,
    bootstrap: str,
    topic: str,
    *,
    raw: bool = False,
    err: TextIO = sys.stderr,
    security: KafkaSecurity = PLAINTEXT,
) -> ProduceReport:
    """`produce` of a file (- for stdin), its progress on a bar when err is a terminal."""
    if path == "-":
        return produce(read_lines(sys.stdin.buffer, err), bootstrap, topic, raw=raw, err=err, security=security)
    with open(path, "rb") as lines:
        return produce(read_lines(lines, err), bootstrap, topic, raw=raw, err=err, security=security)
