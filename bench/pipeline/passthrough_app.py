"""A minimal Faust pass-through agent: events topic -> output topic, raw
bytes, nothing else (the Faust floor of bench/pipeline/floors.py).

    LW_BROKER=127.0.0.1:9092 LW_SRC=a LW_DST=b LW_APP=x LW_DATA=/tmp/x \
        python -m bench.pipeline.passthrough_app worker -l warn

Same producer settings as ``loopwarden worker`` (its default linger, acks=all),
default Faust acknowledgements (an event is acknowledged when the agent asks
for the next one). Prints "ASSIGNED" when it owns partitions.
"""

from __future__ import annotations

import os

import faust

from streams.kafka import clients as kafka_clients
from streams.worker.settings import DEFAULTS

app = faust.App(
    os.environ.get("LW_APP", "passthrough"),
    **kafka_clients.faust_connection(os.environ.get("LW_BROKER", "127.0.0.1:9092")),
    autodiscover=False,
    store="memory://",
    datadir=os.environ.get("LW_DATA", "/tmp/lw-passthrough"),
    key_serializer="raw",
    value_serializer="raw",
    topic_disable_leader=True,
    consumer_auto_offset_reset="earliest",
    producer_linger_ms=DEFAULTS.linger_ms,
    web_enabled=False,
)
source = app.topic(
    os.environ.get("LW_SRC", "in"), key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
DESTINATION = os.environ.get("LW_DST", "out")


@app.agent(source, name="passthrough")
async def passthrough(stream):  # type: ignore[no-untyped-def]
    send = app.producer.send
    async for event in stream.events():
        message = event.message
        await send(DESTINATION, message.key, message.value, None, None, None)


@app.on_partitions_assigned.connect
async def _assigned(sender, assigned=(), **kwargs):  # type: ignore[no-untyped-def]
    if assigned:
        print("ASSIGNED", len(assigned), flush=True)


if __name__ == "__main__":
    app.main()
