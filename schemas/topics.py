"""The Kafka side of the contract: the topics' default names and the headers
of a dead letter. Every producer and reader of these topics takes them from here."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

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

# Tenants: one topic pair each, under its own principal and ACLs (docs/SECURITY.md, "Tenants").
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""A tenant's name: what its topics and its principal are named after."""
_TENANT_TOPIC = re.compile(r"^loopwarden\.([a-z0-9][a-z0-9_-]{0,62})\.(events|decisions)$")
EVENTS_TOPIC_ENV = "LOOPWARDEN_EVENTS_TOPIC"
"""The events topic a gateway publishes to (a tenant's `gateway.env` names its own)."""
DECISIONS_TOPIC_ENV = "LOOPWARDEN_DECISIONS_TOPIC"
"""The decisions topic a gateway reads."""


def tenant_topics(name: str) -> tuple[str, str]:
    """A tenant's (events, decisions) topics; ValueError for a name that is not a tenant's."""
    if not TENANT_NAME.match(name):
        raise ValueError(
            f"tenant name {name!r}: expected 1 to 63 of a-z, 0-9, '-', '_', starting with a letter or digit"
        )
    return f"loopwarden.{name}.events", f"loopwarden.{name}.decisions"


def tenant_of(topic: str, kind: str = "events") -> str | None:
    """The tenant whose `kind` ("events" or "decisions") topic this is, else None."""
    match = _TENANT_TOPIC.match(topic)
    return match.group(1) if match and match.group(2) == kind else None


def events_topic(environ: Mapping[str, str] = os.environ) -> str:
    """The events topic of a gateway's settings: `LOOPWARDEN_EVENTS_TOPIC`, else the default."""
    return environ.get(EVENTS_TOPIC_ENV) or EVENTS_TOPIC


def decisions_topic(environ: Mapping[str, str] = os.environ) -> str:
    """The decisions topic of a gateway's settings: `LOOPWARDEN_DECISIONS_TOPIC`, else the default."""
    return environ.get(DECISIONS_TOPIC_ENV) or DECISIONS_TOPIC
