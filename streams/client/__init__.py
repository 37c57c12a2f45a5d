"""The Python gateway client: publishes a run's events and waits for verdicts."""

from streams.client.guard import DECISIONS_TOPIC, EVENTS_TOPIC, Call, ClientVerdict, GuardClient, Policy, minimal_args

__all__ = [
    "DECISIONS_TOPIC",
    "EVENTS_TOPIC",
    "Call",
    "ClientVerdict",
    "GuardClient",
    "Policy",
    "minimal_args",
]
