"""The Kafka side of the contract: the topics' default names and the headers
of a dead letter. Every producer and reader of these topics takes them from here."""

from __future__ import annotations

EVENTS_TOPIC = "loopwarden.events"
"""Gateway events (schemas/events.py), keyed by run id."""
DECISIONS_TOPIC = "loopwarden.decisions"
"""Verdicts (schemas/verdicts.py), keyed by run id."""
INCIDENTS_TOPIC = "loopwarden.incidents"
"""Incidents (schemas/incidents.py) of the fleet stage, keyed by fingerprint."""
DEADLETTER_TOPIC = "loopwarden.deadletter"
"""Refused events, unchanged, with the headers below."""

# Headers of a dead letter: why it was refused and where it came from.
HEADER_REASON = "loopwarden.reason"
HEADER_KIND = "loopwarden.kind"
HEADER_SOURCE_TOPIC = "loopwarden.source.topic"
HEADER_SOURCE_PARTITION = "loopwarden.source.partition"
HEADER_SOURCE_OFFSET = "loopwarden.source.offset"
