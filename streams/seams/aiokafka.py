"""aiokafka's non-public members that loopwarden relies on (see ``streams.seams``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record import default_records as py_records
from aiokafka.record._crecords import default_records as c_records
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.memory_records import MemoryRecords

from streams.seams import Seam, attribute, compiled_constructor, method, module_global

__all__ = [
    "BatchBuilder",
    "CODECS",
    "DECODERS",
    "RELIED_ON",
    "build",
    "partition_records",
    "record",
    "replace_decoders",
    "replace_partition_records",
    "set_fetch_wait",
]

#: The compression codes ``BatchBuilder`` takes, by name: aiokafka maps its
#: producer's ``compression_type`` names to them only inside the producer.
CODECS = {
    "zstd": DefaultRecordBatch.CODEC_ZSTD,
    "lz4": DefaultRecordBatch.CODEC_LZ4,
    "snappy": DefaultRecordBatch.CODEC_SNAPPY,
    "gzip": DefaultRecordBatch.CODEC_GZIP,
    "none": DefaultRecordBatch.CODEC_NONE,
}

#: Compress a closed batch now. Otherwise the sender builds it as it makes
#: the next produce request, which the verdicts then wait in; aiokafka has
#: no public way to build a batch early.
build = BatchBuilder._build


def set_fetch_wait(consumer: AIOKafkaConsumer, min_bytes: int, max_wait_ms: int) -> None:
    """Change the two values the started ``consumer``'s fetcher puts in each
    fetch request from now on: aiokafka takes them only as constructor arguments."""
    fetcher = consumer._fetcher  # created when the consumer started, before any fetch
    fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms = min_bytes, max_wait_ms


def partition_records() -> type:
    """The class the fetcher reads each partition's fetched records through
    (looked up at each fetch), as it is now: aiokafka's or a replacement."""
    return fetcher.PartitionRecords


def replace_partition_records(cls: type) -> None:
    """Read every partition's fetched records through ``cls`` from now on:
    aiokafka decompresses a batch inside that reading and offers no hook there."""
    fetcher.PartitionRecords = cls  # type: ignore[misc]


#: The decoders a compressed record batch calls, by the global name its
#: record module looks them up under at each batch.
DECODERS = ("gzip_decode", "lz4_decode", "zstd_decode", "snappy_decode")
#: The record modules that call them: the compiled one aiokafka uses when it
#: is built, and the Python fallback.
RECORD_MODULES = (c_records, py_records)


def replace_decoders(decoders: Mapping[str, Callable[[Any], bytes | bytearray]]) -> None:
    """Decompress every record batch read from now on with ``decoders`` (by
    name, of ``DECODERS``): aiokafka has no setting for the decoders it uses."""
    unknown = set(decoders) - set(DECODERS)
    if unknown:
        raise ValueError(f"not a decoder aiokafka's record modules call: {sorted(unknown)}")
    for module in RECORD_MODULES:
        for name, decode in decoders.items():
            setattr(module, name, decode)


def record(offset: int, timestamp: int, timestamp_type: int, value: bytes) -> Any:
    """A record without key or headers, as a fetched batch yields one: aiokafka
    builds them only while reading a batch. By keyword, so that a renamed
    parameter fails here rather than building a different record."""
    return c_records.DefaultRecord(
        offset=offset, timestamp=timestamp, timestamp_type=timestamp_type, key=None, value=value, headers=[]
    )


RELIED_ON: tuple[Seam, ...] = (
    # BatchBuilder itself: ``create_batch`` returns one, but of the producer's
    # batch size and compression; the changelog's batches have their own.
    method(
        BatchBuilder,
        "__init__",
        ("self", "batch_size", "compression_type", "is_transactional", "key_serializer", "value_serializer"),
        "a record batch of a size and compression of its own",
    ),
    *(
        attribute(DefaultRecordBatch, f"CODEC_{name.upper()}", "a compression code", on_instance=False)
        for name in ("zstd", "lz4", "snappy", "gzip", "none")
    ),
    method(BatchBuilder, "_build", ("self",), "compress a batch before the sender does"),
    attribute(AIOKafkaConsumer, "_fetcher", "the fetcher whose request values the fetch hold sets"),
    attribute(Fetcher, "_fetch_min_bytes", "a fetch request's min_bytes, read per request"),
    attribute(Fetcher, "_fetch_max_wait_ms", "a fetch request's max_wait_time, read per request"),
    # The decompression bound (streams/worker/expansion.py).
    module_global(fetcher, "PartitionRecords", "the class a fetch's records are read through, replaced"),
    method(
        fetcher.PartitionRecords,
        "__init__",
        (
            "self",
            "tp",
            "records",
            "aborted_transactions",
            "fetch_offset",
            "key_deserializer",
            "value_deserializer",
            "check_crcs",
            "isolation_level",
        ),
        "the partition and its records first, which the replacement wraps",
    ),
    attribute(MemoryRecords, "has_next", "what PartitionRecords asks the records it wraps", on_instance=False),
    attribute(MemoryRecords, "next_batch", "the batch PartitionRecords decompresses, wrapped", on_instance=False),
    *(
        module_global(module, name, "a decoder looked up at each batch, replaced", ("payload",))
        for module in RECORD_MODULES
        for name in DECODERS
    ),
    compiled_constructor(
        c_records.DefaultRecord,
        ("offset", "timestamp", "timestamp_type", "key", "value", "headers"),
        (0, 0, 0, None, b"", []),
        "the record that stands for a batch refused whole",
    ),
)
