"""Which events topics one worker group serves, and where each one's verdicts go.

The worker's own pair (`--events-topic`, `--decisions-topic`) is the default
tenant's; every tenant made by `loopwarden tenants add` has its pair
`loopwarden.NAME.events` / `loopwarden.NAME.decisions` (docs/SECURITY.md,
"Tenants"). The worker subscribes to all of them, found at start-up and again
every `--tenant-refresh` from the topics its principal may describe (its ACLs
name exactly the tenants' topics). faust-streaming's aiokafka driver does not
subscribe by pattern, so the list is explicit: a topic added with
``app.topics.add`` is subscribed at Faust's next resubscription.

A run's state is keyed by (tenant, run id): the default tenant's key is the
run id's UTF-8 bytes, as before tenants; a tenant's is ``0xFF NAME 0xFF`` and
the run id, a prefix no UTF-8 run id can start with, so equal run ids of two
tenants never meet (`key_prefix`; the fleet stage keys fingerprints so too,
and its `TenantWatch` reads every tenant's decisions topic). Every events topic has the partitions of the worker's
own, so Faust's assignor co-partitions it with the run table: partition p of
any of them goes to the worker holding the table's partition p. A tenant's
topic with another partition count is not served (one warning line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from schemas.topics import tenant_of, tenant_topics
from streams.kafka.clients import KafkaSecurity
from streams.observability import logs

log = logging.getLogger("loopwarden.worker")

_SEPARATOR = b"\xff"
"""Never a byte of UTF-8 text: a tenant's keys cannot be spelt by a run id."""


def key_prefix(tenant: str | None) -> bytes:
    """What a tenant's keys start with: nothing for the default pair."""
    return b"" if tenant is None else _SEPARATOR + tenant.encode() + _SEPARATOR


def split_key(key: bytes) -> tuple[str | None, bytes]:
    """The tenant of a key `key_prefix` began, and the rest."""
    if not key.startswith(_SEPARATOR):
        return None, key
    tenant, _, rest = key[1:].partition(_SEPARATOR)
    return tenant.decode(), rest


class Route(NamedTuple):
    """Where an events topic's verdicts go (the decisions topic and its
    partition count, for an event's `reply_partition`), and how its runs are keyed."""

    tenant: str | None
    decisions: str
    partitions: int
    prefix: bytes


class Routes:
    """The events topics served, each with its route; ``topic in routes`` for the transport."""

    def __init__(self, events: str, decisions: str, partitions: int) -> None:
        self._routes = {events: Route(None, decisions, partitions, b"")}

    def __contains__(self, topic: object) -> bool:
        return topic in self._routes

    def __getitem__(self, topic: str) -> Route:
        return self._routes[topic]

    def tenant(self, topic: str) -> str | None:
        """Whose events topic this is (None: the worker's own, or not served)."""
        route = self._routes.get(topic)
        return None if route is None else route.tenant

    def add(self, tenant: str, partitions: int) -> str:
        """Serve a tenant whose decisions topic has `partitions`; returns its events topic."""
        events, decisions = tenant_topics(tenant)
        self._routes[events] = Route(tenant, decisions, partitions, key_prefix(tenant))
        return events


Found = tuple[dict[str, int], dict[str, int]]
"""Tenants to serve with their decisions topic's partition count, and those
not servable with their events topic's partition count."""


def discover(bootstrap: str, security: KafkaSecurity, partitions: int | None) -> Found:
    """Tenants whose two topics this principal may describe, and those whose
    events topic has another partition count than `partitions` (not servable;
    None: any count is, for a reader of the decisions topics only)."""
    from streams.kafka.topics import connected_admin, partitions_of

    admin = connected_admin(bootstrap, 30.0, security)
    try:
        names = sorted(name for topic in admin.list_topics() if (name := tenant_of(topic)) is not None)
        pairs = {name: tenant_topics(name) for name in names}
        counts = partitions_of(admin, [topic for pair in pairs.values() for topic in pair], security)
    finally:
        admin.close()
    servable: dict[str, int] = {}
    mismatched: dict[str, int] = {}
    for name, (events, decisions) in pairs.items():
        if events not in counts or decisions not in counts:
            continue
        if partitions is None or counts[events] == partitions:
            servable[name] = counts[decisions]
        else:
            mismatched[name] = counts[events]
    return servable, mismatched


def discover_at_start(
    bootstrap: str, security: KafkaSecurity, partitions: int | None, refresh: float, logger: logging.Logger
) -> Found | None:
    """`discover` before Faust starts (none when `refresh` is 0), or None once a
    `startup_failed` line has said why the cluster could not be read."""
    from streams.kafka.topics import TopicError

    if refresh <= 0:
        return {}, {}
    try:
        return discover(bootstrap, security, partitions)
    except TopicError as exc:
        logs.event(logger, logging.ERROR, str(exc), event="startup_failed")
        return None


class TenantWatch:
    """Looks for new tenants every `--tenant-refresh` and hands each, with its
    decisions topic's partition count, to `serve` once (`discover` with `partitions`)."""

    def __init__(
        self,
        bootstrap: str,
        security: KafkaSecurity,
        partitions: int | None,
        serve: Callable[[str, int], None],
        logger: logging.Logger = log,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.partitions = partitions
        self.serve = serve
        self.log = logger
        self._served: set[str] = set()
        self._warned: set[str] = set()

    def take(self, tenants: dict[str, int], mismatched: dict[str, int]) -> None:
        for tenant, partitions in tenants.items():
            if tenant not in self._served:
                self._served.add(tenant)
                self.serve(tenant, partitions)
                logs.event(self.log, logging.INFO, "tenant served", event="tenant_added", tenant=tenant)
        for tenant, count in mismatched.items():
            if tenant not in self._warned:
                self._warned.add(tenant)
                logs.event(
                    self.log,
                    logging.WARNING,
                    "tenant not served: its events topic has another partition count than the worker's",
                    event="tenant_skipped",
                    tenant=tenant,
                    partitions=count,
                    expected=self.partitions,
                )

    async def refresh(self) -> None:
        """One look at the cluster, off the event loop (kafka-python blocks)."""
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                None, discover, self.bootstrap, self.security, self.partitions
            )
        except Exception as exc:  # the next refresh tries again
            logs.event(
                self.log, logging.WARNING, "cannot list tenants", event="tenant_refresh_failed", error=str(exc)[:300]
            )
            return
        self.take(*found)
