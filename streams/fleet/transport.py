"""The fleet stage's Kafka transport: Faust's aiokafka driver with the
shared corrections of its rebalance path (``streams.faustapp.consumer``)
and the idempotent producer (``streams.faustapp.producer``).

Registered under the ``loopwarden-fleet://`` broker scheme (the
``faust.transports`` entry point in pyproject.toml), which only the stage's
app uses. Nothing else differs from Faust's driver: the stage keeps Faust's
consumer thread and its delivery of each message to the agents, which
tenant topics joining the subscription while running rely on.
"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as driver

from streams.faustapp import consumer as faustapp_consumer
from streams.faustapp.producer import IdempotentProducer

SCHEME = "loopwarden-fleet"
"""The broker URL scheme this transport is registered under."""


class Transport(driver.Transport):
    """The aiokafka transport with the corrected consumer and the idempotent producer."""

    Consumer = faustapp_consumer.Consumer
    Producer = IdempotentProducer
