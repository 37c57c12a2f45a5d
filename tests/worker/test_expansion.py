"""The decompression bound of streams/worker/expansion.py on real aiokafka
record batches, one per codec, read through aiokafka's own fetch-side
iteration (``PartitionRecords``). The worker on a real broker is in
tests/worker/test_hostile.py."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streams.seams import aiokafka as aiokafka_seams
from streams.worker import expansion

MIB = 1024 * 1024
LIMIT = 2 * MIB
CODECS = {name: aiokafka_seams.CODECS[name] for name in ("gzip", "snappy", "lz4", "zstd")}


@pytest.fixture(scope="module", autouse=True)
def bounded() -> None:
    expansion.install({"events"}, LIMIT)


def _batch(codec: int, values: list[bytes], base_offset: int = 40) -> bytes:
    builder = aiokafka_seams.BatchBuilder(256 * MIB, codec)
    for value in values:
        builder.append(key=b"run", value=value, timestamp=None)
    builder.close()
    data = bytearray(aiokafka_seams.build(builder))
    data[0:8] = base_offset.to_bytes(8, "big")  # the broker's offsets (the CRC does not cover them)
    return bytes(data)


def _records(topic: str, partition: int, batch: bytes, *, check_crcs: bool) -> Any:
    """A partition's fetched records as the fetcher reads them (with the bound installed)."""
    return aiokafka_seams.partition_records()(
        TopicPartition(topic, partition), MemoryRecords(batch), [], 0, None, None, check_crcs, 0
    )


def _read(topic: str, batch: bytes) -> list[tuple[int, bytes]]:
    return [(record.offset, record.value) for record in _records(topic, 3, batch, check_crcs=True)]


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_within_the_bound_reads_as_before(codec: str) -> None:
    values = [b"a" * 100, bytes(LIMIT - 4096), b"b" * 100]
    assert _read("events", _batch(CODECS[codec], values)) == [(40, values[0]), (41, values[1]), (42, values[2])]


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_past_the_bound_is_one_stand_in_at_its_last_offset(codec: str) -> None:
    batch = _batch(CODECS[codec], [b"a" * 100, bytes(40 * MIB), b"b" * 100])
    [(offset, value)] = _read("events", batch)
    assert offset == 42
    assert value == b"" and value.__class__ is expansion.Oversized
    assert value.reason.startswith(
        f"compressed record batch of events[3] offsets 40..42 ({codec}) does not decompress within "
        f"--max-batch-bytes {LIMIT}: "
    ), value.reason


def test_corrupt_compressed_data_is_a_stand_in_too() -> None:
    batch = bytearray(_batch(CODECS["zstd"], [b"a" * 1000]))
    batch[-20:] = bytes(20)  # the payload's tail; CRC checks are off below
    [record] = list(_records("events", 0, bytes(batch), check_crcs=False))
    assert record.value.__class__ is expansion.Oversized and "zstd" in record.value.reason


def test_other_topics_are_not_bounded() -> None:
    """A changelog read at recovery decompresses as aiokafka always did."""
    value = bytes(3 * LIMIT)
    assert _read("changelog", _batch(CODECS["gzip"], [value])) == [(40, value)]


def test_a_gateway_cannot_send_a_stand_in() -> None:
    """An empty record is an empty bytes, never an Oversized."""
    [(_, value)] = _read("events", _batch(CODECS["gzip"], [b""]))
    assert value == b"" and value.__class__ is bytes
