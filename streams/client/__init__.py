"""The Python gateway client: publishes a run's events and waits for verdicts."""

from schemas.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from streams.client.guard import GuardClient
from streams.client.local_hashing import local_call_fields, local_outcome_fields, minimal_args
from streams.client.runs import Call
from streams.client.verdict import ClientVerdict, Policy

__all__ = [
    "DECISIONS_TOPIC",
    "EVENTS_TOPIC",
    "Call",
    "ClientVerdict",
    "GuardClient",
    "Policy",
    "local_call_fields",
    "local_outcome_fields",
    "minimal_args",
]
