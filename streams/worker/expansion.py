"""How far one fetched record batch of an events topic may expand when decompressed.

The fetch size caps what the broker sends (``--max-event-bytes`` plus 64 KiB
per partition), but a compressed batch is decompressed whole before its first
record is read: aiokafka's ``DefaultRecordBatch`` hands its payload to
``gzip_decode`` (or ``lz4_decode``, ``zstd_decode``, ``snappy_decode``) and keeps
the result, so 1 MiB of gzip could become 1 GiB in the worker, and zstd more.

``install`` bounds that for the events topics. aiokafka's decoders are looked
up as module globals of its record module (the C one and the Python fallback);
they are replaced by ones that, inside a batch of an events topic, decompress
into at most ``--max-batch-bytes`` and stop there: gzip through
``zlib.decompressobj`` with ``max_length``; lz4 and zstd with cramjam's
``decompress_into`` into a buffer of the bound, grown from a guess (a few
times the compressed size) so that an ordinary batch does not allocate the
whole bound. Snappy has no bounded decoder here; its format expands at most
about 21-fold, so it is decompressed whole and then measured. Outside an
events batch (a changelog read at recovery) the decoders are aiokafka's own.

A batch that does not fit, or does not decompress at all, stands in the
stream as one record at its last offset whose value is an ``Oversized`` (empty
bytes no fetched record can be, naming the batch): the processor
dead-letters it with that reason, the offsets of the whole batch are
committed with it, and the records around it go on. The aiokafka members
this reaches (the fetcher's ``PartitionRecords``, the decoders' module
globals, ``DefaultRecord``) come through ``streams.seams.aiokafka``, checked
by tests/seams/test_seams.py; tests/worker/test_expansion.py reads real
batches of each codec through them.
"""

from __future__ import annotations

import contextvars
import zlib
from collections.abc import Callable, Container, Iterator
from typing import Any

import cramjam
from aiokafka import codec

from streams.seams import aiokafka as aiokafka_seams

CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: A first buffer for lz4 and zstd: this many times the compressed size
#: (JSON events compress a few times), grown eightfold up to the bound.
FIRST_GUESS_RATIO = 4

_UNBOUNDED = aiokafka_seams.partition_records()
_bound: contextvars.ContextVar[int | None] = contextvars.ContextVar("loopwarden_batch_bound", default=None)


class Oversized(bytes):
    """The value standing for a batch refused whole: empty bytes of this class,
    which no record a gateway publishes can be."""

    reason: str


class _Refused(Exception):
    """A batch's payload does not decompress within the bound."""


def _gzip(payload: Any) -> bytes:
    limit = _bound.get()
    if limit is None:
        return codec.gzip_decode(payload)
    out = bytearray()
    data = bytes(payload)
    try:
        while data:  # a gzip payload may hold several members
            member = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += member.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise _Refused(f"more than {limit} bytes")
            if not member.eof:
                raise _Refused("truncated gzip data")
            data = member.unused_data
    except zlib.error as exc:
        raise _Refused(f"gzip: {exc}") from None
    return bytes(out)


def _into(name: str, decompress_into: Callable[[Any, bytearray], int], whole: Callable[[Any], bytes]) -> Any:
    def decode(payload: Any) -> bytes | bytearray:
        limit = _bound.get()
        if limit is None:
            return whole(payload)
        size = min(limit + 1, max(64 * 1024, FIRST_GUESS_RATIO * len(payload)))
        while True:
            out = bytearray(size)
            try:
                written = decompress_into(payload, out)
            except cramjam.DecompressionError as exc:  # the buffer is full, or the data is bad
                if size > limit:
                    raise _Refused(f"not within {limit} bytes ({name}: {exc})") from None
                size = min(limit + 1, size * 8)
                continue
            if written > limit:
                raise _Refused(f"more than {limit} bytes")
            del out[written:]
            return out

    return decode


def _snappy(payload: Any) -> bytes:
    limit = _bound.get()
    try:
        out = codec.snappy_decode(payload)
    except Exception as exc:
        if limit is None:
            raise
        raise _Refused(f"snappy: {exc}") from None
    if limit is not None and len(out) > limit:
        raise _Refused(f"{len(out)} bytes, more than {limit}")
    return out


_DECODERS: dict[str, Any] = {
    "gzip_decode": _gzip,
    "lz4_decode": _into("lz4", cramjam.lz4.decompress_into, codec.lz4_decode),
    "zstd_decode": _into("zstd", cramjam.zstd.decompress_into, codec.zstd_decode),
    "snappy_decode": _snappy,
}


class _Batch:
    """One fetched compressed batch whose iteration (where aiokafka decompresses) runs under the bound."""

    def __init__(self, batch: Any, topic: str, partition: int, limit: int) -> None:
        self._batch = batch
        self._where = (topic, partition, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __next__(self) -> Any:
        return next(self._batch)

    def __iter__(self) -> Iterator[Any]:
        batch = self._batch
        token = _bound.set(self._where[2])
        try:
            return iter(batch)
        except _Refused as exc:
            return iter((self._stand_in(str(exc)),))
        finally:
            _bound.reset(token)

    def _stand_in(self, why: str) -> Any:
        batch = self._batch
        topic, partition, limit = self._where
        first, last = batch.base_offset, batch.base_offset + batch.last_offset_delta
        value = Oversized()
        value.reason = (
            f"compressed record batch of {topic}[{partition}] offsets {first}..{last} "
            f"({CODEC_NAMES.get(batch.compression_type, batch.compression_type)}) does not decompress within "
            f"--max-batch-bytes {limit}: {why}"
        )
        return aiokafka_seams.record(last, batch.max_timestamp, batch.timestamp_type, value)


class _Records:
    """A partition's fetched records, handing out its batches bounded."""

    def __init__(self, records: Any, topic: str, partition: int, limit: int) -> None:
        self._records = records
        self._where = (topic, partition, limit)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        """The batch itself when uncompressed (nothing to bound), else wrapped."""
        batch = self._records.next_batch()
        if batch is None or not batch.compression_type:
            return batch
        return _Batch(batch, *self._where)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


def install(topics: Container[str], limit: int) -> None:
    """Bound the decompressed size of every batch of `topics` that an aiokafka
    consumer of this process fetches from now on (`topics` is looked up at
    each fetch, so topics added to it later are bounded too)."""

    class PartitionRecords(_UNBOUNDED):  # type: ignore[misc, valid-type]
        def __init__(self, tp: Any, records: Any, *args: Any) -> None:
            if tp.topic in topics:
                records = _Records(records, tp.topic, tp.partition, limit)
            super().__init__(tp, records, *args)

    aiokafka_seams.replace_partition_records(PartitionRecords)
    aiokafka_seams.replace_decoders(_DECODERS)
