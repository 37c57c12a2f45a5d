"""The producer of both Faust apps, the worker's and the fleet stage's.

Faust makes its aiokafka producer idempotent with acks=all only inside
transactions; loopwarden's always is, as every producer of the project: on
a replicated cluster an acknowledged write survives a lost broker, and the
retries after a lost leader neither double nor reorder a run's verdicts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streams.kafka import clients as kafka_clients
from streams.seams import faust as faust_seams


class IdempotentProducer(faust_seams.Producer):
    """Faust's aiokafka producer, idempotent with acks=all whatever the processing guarantee."""

    # Faust's own lines stay under the faust logger (held at --faust-loglevel);
    # mode would otherwise name a subclass's logger after this module.
    logger = logging.getLogger("faust.loopwarden.producer")

    def extra_settings(self) -> Mapping[str, Any]:
        return kafka_clients.DELIVERY
