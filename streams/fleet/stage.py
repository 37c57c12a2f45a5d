"""The fleet stage: a Faust app of its own (`loopwarden fleet`), downstream of the workers.

    loopwarden.decisions        ──block/abort──▶ regrouped by    ──▶ <app-id>-fingerprint-repartition
    loopwarden.NAME.decisions …                  (tenant, fingerprint)  │  partitions = fingerprints
                                                                        ▼
                                     tally = incidents[fingerprint]    (RocksDB + changelog topic)
                                     tally, incidents = count(tally, verdict, …)
                                                                        │
                                     loopwarden.incidents ◀── open / update, keyed as the tally

Every tenant's decisions topic is read as well as the stage's own, found at
start-up and every `--tenant-refresh` as the worker finds tenants
(streams/worker/tenants.py). A tenant's fingerprints are keyed with its
prefix (`key_prefix`), so its verdicts never count towards another's, and
its incidents carry its name; the default pair's keys are the fingerprint
itself, as before tenants.

Verdicts keep Faust's at-least-once processing: an incident is acknowledged
by the broker before the tally that records it is written, so a restart may
publish a record again (identical) but never loses one; a verdict seen again
finds its run already counted and changes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import faust
import msgspec

from schemas.codec import decode_verdict, encode_incident
from schemas.topics import tenant_topics
from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
from streams.faustapp.app import (
    APP_DEFAULTS,
    App,
    Worker,
    connection_accepted,
    log_rebalances,
    web_port_free,
    web_settings,
)
from streams.fleet.incidents import count, fingerprint
from streams.fleet import transport
from streams.fleet.settings import TABLE_NAME, FleetSettings
from streams.fleet.tallies import Tallies
from streams.observability import logs
from streams.observability.metrics import FleetMetrics, install
from streams.tools.secure import private_dir
from streams.worker.tenants import Found, TenantWatch, discover_at_start, key_prefix, split_key

log = logging.getLogger("loopwarden.fleet")


def _verdict(value: bytes, metrics: FleetMetrics) -> Verdict | None:
    """The verdict, or None (with one log line) for bytes that are not one."""
    try:
        return decode_verdict(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        metrics.bad_verdicts.inc()
        logs.event(log, logging.WARNING, "not a verdict: skipped", event="bad_verdict", error=str(exc)[:200])
        return None


def create_fleet_app(settings: FleetSettings, tenants: Found = ({}, {})) -> faust.App:
    """The app: the decision topics (its own and the `tenants`', then each
    tenant found later) regrouped by fingerprint, the tally table, the
    incident topic, and the sweep that forgets idle fingerprints.

    It has the worker's three corrections of Faust's rebalance path
    (docs/PROCESSING.md, "Three Faust behaviours loopwarden corrects"): the
    flow control (`App`), and in its transport (streams/fleet/transport.py)
    the seek of a partition with no committed offset to its beginning and
    the acknowledgements of an older generation ignored. Without them a
    restart before the first commit could drop the verdicts fetched around
    the rebalance for good."""
    app = App(
        settings.app_id,
        **kafka_clients.faust_connection(settings.bootstrap, transport=transport.SCHEME, security=settings.security),
        **APP_DEFAULTS,
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor or 1,
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=min(3.0, settings.session_timeout / 3),
        broker_commit_interval=settings.commit_interval,
        **web_settings(settings.web_port, settings.web_host),
    )
    metrics = FleetMetrics()
    if settings.web_port is not None:
        install(app, metrics)
    decisions = app.topic(settings.decisions_topic, key_type=bytes, value_type=bytes)
    decisions.topics = list(decisions.topics)  # a list that tenants' topics join (read_tenant)
    tenant_of_topic: dict[str, str] = {}
    incidents = app.topic(settings.incidents_topic, key_type=bytes, value_type=bytes)
    regrouped = app.topic(settings.repartition_topic, key_type=bytes, value_type=bytes)
    tallies = Tallies(
        app,
        app.Table(
            TABLE_NAME,
            key_type=bytes,
            value_type=bytes,
            partitions=settings.partitions,
            help="per-fingerprint incident tallies (FingerprintTally, msgpack)",
        ),
    )

    async def take(stored_key: bytes, value: bytes) -> None:
        verdict = _verdict(value, metrics)
        key = None if verdict is None else fingerprint(verdict)
        if verdict is None or key is None:
            return
        tenant = split_key(stored_key)[0]
        metrics.verdicts.labels(decision=verdict.decision).inc()
        tally = tallies.get(stored_key, key)
        counted = count(tally, verdict, key, time.time(), settings.incidents, tenant)
        for incident in counted.incidents:
            delivered = await incidents.send(key=stored_key, value=encode_incident(incident))
            await delivered  # acknowledged before the tally that records it is stored
            metrics.incidents.labels(status=incident.status).inc()
            logs.event(
                log,
                logging.WARNING,
                f"incident {incident.status}",
                event=f"incident_{incident.status}",
                fingerprint=key,
                tenant=tenant or "-",
                window_start=incident.window_start,
                runs=incident.runs,
                agents=incident.agents,
                scope=incident.scope,
                tool=incident.tool_name,
                detector=incident.detector,
            )
        if counted.tally is not None:
            tallies.put(stored_key, counted.tally)

    # The repartition Faust's group_by does (event.forward with the new key),
    # with the filter in front of it: group_by moves a preceding filter behind
    # the repartition (faust-streaming issue 553), which would copy every
    # verdict, allows included, to the fingerprint topic.
    @app.agent(decisions, name=f"{settings.app_id}.regroup")
    async def regroup(stream: Any) -> None:
        async for event in stream.events():
            verdict = _verdict(event.value, metrics)
            key = None if verdict is None else fingerprint(verdict)
            if key is not None:
                prefix = key_prefix(tenant_of_topic.get(event.message.topic))
                await event.forward(regrouped, key=prefix + key.encode())

    @app.agent(regrouped, name=f"{settings.app_id}.count")
    async def count_verdicts(stream: Any) -> None:
        async for key, value in stream.items():
            await take(key, value)

    def read_tenant(tenant: str, partitions: int) -> None:
        """The regroup agent reads this tenant's decisions topic too. Its topic
        list is shared by the agent's channel and every clone of it (Faust
        passes the list on), so the name joins all of them; the conductor
        then subscribes to it at its next resubscription, which re-adding a
        channel asks for."""
        name = tenant_topics(tenant)[1]
        tenant_of_topic[name] = tenant
        if name in decisions.topics:
            return
        decisions.topics.append(name)
        for channel in [c for c in app.topics if c.topics is decisions.topics]:
            app.topics.discard(channel)
            app.topics.add(channel)

    if settings.tenant_refresh > 0:
        watch = TenantWatch(settings.bootstrap, settings.security, None, read_tenant, log)
        watch.take(*tenants)

        async def look_for_tenants() -> None:
            await watch.refresh()

        app.timer(settings.tenant_refresh, name="loopwarden.fleet.tenants")(look_for_tenants)

    async def sweep() -> None:
        expired = await tallies.sweep(settings.ttl)
        if expired:
            logs.event(log, logging.INFO, "idle fingerprints forgotten", event="swept", fingerprints=expired)

    app.timer(min(60.0, settings.ttl / 10), name="loopwarden.fleet.sweep")(sweep)
    log_rebalances(app, log, settings.repartition_topic)
    return app


def run_fleet(settings: FleetSettings) -> int:
    """`loopwarden fleet`: run the stage until stopped; the process exit code."""
    from streams.kafka.topics import TopicError, ensure, log_created, replication, require_topic

    logs.setup(settings.loglevel, "logfmt", library_level=settings.faust_loglevel)
    if not web_port_free(log, settings.web_port, settings.web_host):
        return 1
    if not connection_accepted(log, settings.bootstrap, settings.security, timeout=settings.connect_timeout):
        return 2
    # The topics exist before Faust subscribes: one created after the
    # subscription would be assigned only at the next metadata refresh.
    try:
        require_topic(settings.bootstrap, settings.decisions_topic, security=settings.security)
        replicas = replication(settings.bootstrap, settings.replication_factor, security=settings.security)
        settings = replace(settings, replication_factor=replicas)
        own = [
            (settings.repartition_topic, settings.partitions, {}),
            (settings.incidents_topic, settings.partitions, {}),
            # Compacted, as Faust makes a table's changelog. Left to Faust, its
            # creation can race the first metadata read: the table then sees
            # it with 0 partitions and every tally write fails
            # (PartitionsMismatch) until the next metadata refresh.
            (settings.changelog_topic, settings.partitions, {"cleanup.policy": "compact"}),
        ]
        log_created(log, ensure(settings.bootstrap, own, settings.replication_factor, security=settings.security))
    except TopicError as exc:
        logs.event(log, logging.ERROR, str(exc), event="startup_failed")
        return 1
    if not connection_accepted(log, settings.bootstrap, settings.security, group=settings.app_id):
        return 2
    tenants = discover_at_start(settings.bootstrap, settings.security, None, settings.tenant_refresh, log)
    if tenants is None:
        return 1
    private_dir(settings.data_dir)
    app = create_fleet_app(settings, tenants)
    logs.event(
        log,
        logging.INFO,
        "fleet stage starting",
        event="starting",
        app_id=settings.app_id,
        bootstrap=settings.bootstrap,
        **settings.security.log_fields(),
        decisions=settings.decisions_topic,
        tenants=",".join(sorted(tenants[0])) or "-",
        incidents=settings.incidents_topic,
        partitions=settings.partitions,
        window=settings.incidents.window,
        min_runs=settings.incidents.min_runs,
        max_runs=settings.incidents.max_runs,
        data_dir=str(settings.data_dir),
    )
    worker = Worker(
        app,
        logger=log,
        stop_timeout=25.0,
        loglevel=settings.loglevel,
        quiet=True,
        override_logging=False,
        redirect_stdouts=False,
    )
    worker.spinner = None
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
