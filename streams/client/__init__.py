"""The Python gateway client: publishes a run's events and waits for verdicts."""

from schemas.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from streams.client.guard import (
    Call,
    ClientVerdict,
    GuardClient,
    Policy,
    local_call_fields,
    local_outcome_fields,
    minimal_args,
)

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
