"""aiokafka's non-public members that loopwarden relies on (see ``streams.seams``)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from streams.seams import Seam, attribute, method

__all__ = ["BatchBuilder", "CODECS", "RELIED_ON", "build", "set_fetch_wait"]

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
)
