"""The tests' own Kafka reader (helpers.consume) on a real broker: a topic
created while it waits is read, one never created is named."""

from __future__ import annotations

import threading

import pytest

from helpers import consume, names, produce
from streams.kafka.topics import ensure


def test_consume_waits_for_a_topic_created_meanwhile(broker):
    topic = names("late")["events"]

    def create_and_fill() -> None:
        ensure(broker.bootstrap, [(topic, 2, {})], 1)
        produce(broker.bootstrap, topic, [b"a", b"b", b"c"], keys=[b"x", b"y", b"z"])

    late = threading.Timer(1.0, create_and_fill)
    late.start()
    try:
        records = consume(broker.bootstrap, topic, count=3, timeout=60)
    finally:
        late.join()
    assert sorted(record.value for record in records) == [b"a", b"b", b"c"]


def test_consume_names_a_topic_that_never_appears(broker):
    topic = names("never")["events"]
    with pytest.raises(TimeoutError, match=f"topic '{topic}' has no partitions after 1 s"):
        consume(broker.bootstrap, topic, count=1, timeout=1)
