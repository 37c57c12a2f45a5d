"""The bare aiokafka relay: consume -> produce between two topics, nothing
else. It is the two-hop floor of any Kafka pipeline on this machine, the
baseline the worker is compared to (throughput in floors.py and
throughput.py, latency in latency.py).

    python -m bench.pipeline.relay --bootstrap HOST:PORT --source T1 --destination T2 [--prefix BYTES]

As a command it runs until SIGTERM, forwarding each record whose value
starts with ``--prefix`` (all by default) with its key; it prints
``relay ready`` once it has its partitions. Its clients have the worker's
producer settings (acks=all, the worker's default ``--linger``) and aiokafka's
consumer defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from bench.pipeline import common as c
from streams.worker.settings import DEFAULTS

#: The worker's producer settings (Faust's acks=-1, its default --linger).
PRODUCER = {"acks": "all", "linger_ms": DEFAULTS.linger_ms}


async def start_clients(bootstrap: str, source: str) -> tuple[Any, Any]:
    """(consumer assigned every partition of ``source`` from the beginning, producer), both started."""
    from aiokafka import TopicPartition

    from streams.kafka import clients as kafka_clients

    consumer = kafka_clients.aio_consumer(
        bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    producer = kafka_clients.aio_producer(bootstrap, **PRODUCER)
    await consumer.start()
    await producer.start()
    consumer.assign([TopicPartition(source, p) for p in range(c.partition_count(bootstrap, source))])
    return consumer, producer


async def forever(bootstrap: str, source: str, destination: str, prefix: bytes) -> None:
    consumer, producer = await start_clients(bootstrap, source)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    for tp in consumer.assignment():
        await consumer.position(tp)
    print("relay ready", flush=True)
    send = producer.send
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=10000)
            for records in batch.values():
                for r in records:
                    if r.value.startswith(prefix):
                        await send(destination, r.value, key=r.key)
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--destination", required=True)
    p.add_argument("--prefix", default="", help="forward only values starting with these bytes (default: all)")
    args = p.parse_args()
    asyncio.run(forever(args.bootstrap, args.source, args.destination, args.prefix.encode()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
