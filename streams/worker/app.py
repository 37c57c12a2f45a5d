"""The stream processor: a Faust app, partitioned by run id.

    loopwarden.events ──▶ transport ──▶ processor ──▶ engine.apply ──▶ loopwarden.decisions
                                            │              ╰── bad input ──▶ loopwarden.deadletter
                                            ╰── checkpoint: verdicts acked ▶ run states stored ▶ events acked

- streams/worker/transport.py: the Kafka transport, handing the events topic
  over in whole fetched batches;
- streams/worker/processor.py: decode, apply, send, dead letters;
- streams/worker/checkpoint.py: the order in which a batch is finished;
- streams/worker/store.py: the runs table, the states in flight, the TTL sweep
  (on the table store every loopwarden app shares, streams/faustapp/table.py).

Faust is used with raw bytes everywhere (no models, no serializer work); the
verdict bytes are exactly ``encode_verdict``.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import replace
from typing import Any


from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from streams.kafka import clients as kafka_clients
from streams.faustapp.app import (
    App,
    APP_DEFAULTS,
    Worker,
    connection_accepted,
    log_rebalances,
    web_port_free,
    web_settings,
)
from streams.observability import logs
from streams.observability.metrics import install as install_metrics
from streams.worker.processor import Processor
from streams.worker.settings import EXACTLY_ONCE, Settings
from streams.worker import expansion, transport
from streams.worker.tenants import Found, TenantWatch, discover_at_start
from streams.tools.secure import private_dir

log = logging.getLogger("loopwarden.worker")

TABLE_NAME = "runs"

#: Producer request limit: a dead letter carries an event of up to
#: --max-event-bytes unchanged, plus headers.
PRODUCER_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: Most bytes one fetch returns per partition: an event of --max-event-bytes
#: and its batch's framing. Faust asks for 4 MiB, and a compressed batch of
#: that much can expand a thousandfold in the worker.
FETCH_OVERHEAD_BYTES = 64 * 1024

#: Per-partition producer batch: room for a few hundred stored states, not
#: Faust's 16 KiB (three full states), which splits one flush into thousands of requests.
PRODUCER_BATCH_BYTES = 512 * 1024


class WorkerApp(App):
    """The worker's app: the intake its transport feeds the events topic to."""

    intake: Processor | None = None
    #: ``--fetch-hold`` in seconds (transport.FetchPacer); 0: never held.
    fetch_hold = 0.0
    #: ``--changelog-compression`` (transport.Producer.records_codec).
    changelog_compression = "none"


#: Young-generation collections every 50,000 net allocations instead of 700,
#: and full ones rarely: a gateway waits while the worker collects.
GC_THRESHOLDS = (50_000, 50, 1_000)


def settle_gc() -> None:
    """Once the worker runs: move what start-up built (Faust, the app, the
    modules) out of the collector's way, and collect young objects in larger,
    rarer passes: p99 at 2,000 calls/s about halved (CHANGELOG.md, "30 Nov
    2026", "Worker")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def create_app(
    settings: Settings,
    config: FleetConfig,
    events_partitions: int,
    policy: FleetPolicy | None = None,
    tenants: Found = ({}, {}),
    decisions_partitions: int | None = None,
) -> tuple[WorkerApp, Processor]:
    """The Faust app with its topics, table, processing task and timers.
    With a `--tenant-refresh`, `tenants` (`streams.worker.tenants.discover`)
    are served from the start, and new ones looked for every refresh.
    `settings.topics.replication_factor` (resolved by `run_worker`) is what
    Faust creates the table's changelog with."""
    from streams.kafka.topics import replication_configs

    replicas = settings.topics.replication_factor or 1
    app = WorkerApp(
        settings.app_id,
        **kafka_clients.faust_connection(settings.bootstrap, transport=transport.SCHEME, security=settings.security),
        **APP_DEFAULTS,
        datadir=str(settings.data_dir),
        processing_guarantee=settings.processing_guarantee,
        topic_partitions=events_partitions,
        topic_replication_factor=replicas,
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=settings.heartbeat_interval,
        broker_commit_interval=settings.commit_interval,
        stream_recovery_delay=settings.recovery_delay,
        producer_linger_ms=settings.linger_ms,
        producer_max_request_size=PRODUCER_MAX_REQUEST_BYTES,
        consumer_max_fetch_size=settings.max_event_bytes + FETCH_OVERHEAD_BYTES,
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_partitioner=transport.KeyPartitioner(),
        **web_settings(settings.web_port, settings.web_host),
    )

    def subscribe(name: str) -> None:
        """Subscribed, acknowledged, committed as an agent's topic would be."""
        topic = app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=events_partitions,
        )
        app.topics.add(topic)

    table = app.Table(
        TABLE_NAME,
        key_type=bytes,  # bytes types mean the "raw" serializer: no codec work
        value_type=bytes,
        partitions=events_partitions,
        help="per-run loop-detection state (StoredRun, msgpack)",
        extra_topic_configs=replication_configs(replicas),
        options={
            "write_buffer_size": 4 * 1024 * 1024,
            "max_write_buffer_number": 2,
            "block_cache_size": 8 * 1024 * 1024,
            "block_cache_compressed_size": 0,
        },
    )
    processor = Processor(app, settings, config, table, policy, decisions_partitions or events_partitions)
    expansion.install(processor.topics, settings.max_batch_bytes)
    if settings.web_port is not None:
        install_metrics(app, processor.metrics)  # GET /metrics on the web server
    subscribe(settings.topics.events)
    if settings.tenant_refresh > 0:
        routes = processor.topics
        watch = TenantWatch(
            settings.bootstrap,
            settings.security,
            events_partitions,
            lambda tenant, partitions: subscribe(routes.add(tenant, partitions)),
        )
        watch.take(*tenants)

        async def look_for_tenants() -> None:
            await watch.refresh()

        app.timer(settings.tenant_refresh, name="loopwarden.tenants")(look_for_tenants)
    app.intake = processor
    app.fetch_hold = settings.fetch_hold
    app.changelog_compression = settings.changelog_compression

    async def process() -> None:
        settle_gc()
        await processor.run()

    app.task(process, traced=False)

    # Timer functions take no argument: Faust passes the app to one that does.
    async def sweep() -> None:
        await processor.sweep()

    async def report() -> None:
        await processor.report()

    app.timer(settings.effective_sweep_interval, name="loopwarden.sweep")(sweep)
    app.timer(settings.stats_interval, name="loopwarden.report")(report)

    @app.on_before_shutdown.connect
    async def _final_counts(sender: Any, **kwargs: Any) -> None:
        await processor.report(final=True)
        if processor.trace is not None:
            processor.trace.flush()

    log_rebalances(app, log, settings.topics.events)
    return app, processor


def run_worker(settings: Settings) -> int:
    """``loopwarden worker``: load config, make topics, run until stopped.

    Returns the process exit code; a config error raises ConfigError (the CLI
    turns it into exit 2) before anything connects to Kafka.
    """
    from schemas.configfile import ROLLING_OFF, load_config, rolling_off
    from schemas.policyfile import load_policy
    from streams.kafka.topics import TopicError, ensure_topics, log_created, replication, require_topic

    logs.setup(settings.loglevel, settings.log_format, library_level=settings.faust_loglevel)
    resolved = load_config(settings.config_path)
    policy = load_policy(settings.policy_path)
    for note in resolved.notes:
        logs.event(log, logging.WARNING, note, event="config_corrected")
    if rolling_off(resolved.config):
        logs.event(log, logging.INFO, ROLLING_OFF, event="rolling_off")
    try:
        transport.codec_for(settings.changelog_compression)
    except ValueError as exc:
        logs.event(log, logging.ERROR, f"--changelog-compression: {exc}", event="startup_failed")
        return 2
    if settings.max_batch_bytes < settings.max_event_bytes:
        limits = f"{settings.max_batch_bytes} < --max-event-bytes {settings.max_event_bytes}"
        logs.event(
            log, logging.ERROR, f"--max-batch-bytes {limits}: no event that size could pass", event="startup_failed"
        )
        return 2
    if not web_port_free(log, settings.web_port, settings.web_host):
        return 1
    if not connection_accepted(log, settings.bootstrap, settings.security, timeout=settings.connect_timeout):
        return 2
    try:
        replicas = replication(settings.bootstrap, settings.topics.replication_factor, security=settings.security)
        settings = settings.with_(topics=replace(settings.topics, replication_factor=replicas))
        if settings.create_topics:
            states = ensure_topics(settings.bootstrap, settings.topics, security=settings.security)
            log_created(log, states)
            partitions, decisions_partitions = states[0].partitions, states[1].partitions
        else:
            partitions = require_topic(settings.bootstrap, settings.topics.events, security=settings.security)
            decisions_partitions = require_topic(
                settings.bootstrap, settings.topics.decisions, security=settings.security
            )
    except TopicError as exc:
        logs.event(log, logging.ERROR, str(exc), event="startup_failed")
        return 1
    if not connection_accepted(log, settings.bootstrap, settings.security, group=settings.app_id):
        return 2
    tenants = discover_at_start(settings.bootstrap, settings.security, partitions, settings.tenant_refresh, log)
    if tenants is None:
        return 1
    private_dir(settings.data_dir)
    if settings.processing_guarantee == EXACTLY_ONCE:
        logs.event(
            log,
            logging.WARNING,
            "exactly_once puts verdicts in Kafka transactions but not the run table; see docs/PROCESSING.md",
            event="guarantee",
        )
    app, _processor = create_app(settings, resolved.config, partitions, policy, tenants, decisions_partitions)
    logs.event(
        log,
        logging.INFO,
        "worker starting",
        event="starting",
        app_id=settings.app_id,
        bootstrap=settings.bootstrap,
        **settings.security.log_fields(),
        events=settings.topics.events,
        decisions=settings.topics.decisions,
        deadletter=settings.topics.deadletter,
        tenants=",".join(sorted(tenants[0])) or "none",
        partitions=partitions,
        replicas=settings.topics.replication_factor,
        guarantee=settings.processing_guarantee,
        changelog_compression=settings.changelog_compression,
        standby_replicas=settings.standby_replicas,
        ttl=settings.ttl,
        max_seq_jump=settings.max_seq_jump,
        data_dir=str(settings.data_dir),
        config=settings.config_path or os.environ.get("LOOPWARDEN_CONFIG") or "(defaults)",
    )
    worker = Worker(
        app,
        logger=log,
        stop_timeout=settings.stop_timeout,
        loglevel=settings.loglevel,
        quiet=True,
        override_logging=False,
        redirect_stdouts=False,
    )
    worker.spinner = None  # no terminal animation: the log is the interface
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
