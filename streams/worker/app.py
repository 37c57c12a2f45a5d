"""The stream processor: a Faust app, partitioned by run id.

    loopwarden.events ──▶ transport ──▶ processor ──▶ engine.apply ──▶ loopwarden.decisions
                                            │              ╰── bad input ──▶ loopwarden.deadletter
                                            ╰── checkpoint: verdicts acked ▶ run states stored ▶ events acked

- streams/worker/transport.py: the Kafka transport, handing the events topic
  over in whole fetched batches;
- streams/worker/processor.py: decode, apply, send, dead letters;
- streams/worker/checkpoint.py: the order in which a batch is finished;
- streams/worker/store.py: the runs table, the states in flight, the TTL sweep.

Faust is used with raw bytes everywhere (no models, no serializer work); the
verdict bytes are exactly ``encode_verdict``.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from dataclasses import replace
from typing import Any

import faust
from faust.worker import Worker as FaustWorker
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from streams import kafka_clients, listen
from streams.observability import logs
from streams.observability.metrics import install as install_metrics
from streams.worker.processor import Processor
from streams.worker.settings import EXACTLY_ONCE, Settings, format_duration
from streams.worker import transport
from streams.worker.store import STORE_URL
from streams.worker.tenants import Found, TenantWatch, discover
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


class FlowControl(FlowControlEvent):
    """Faust's flow control, emptying the agents' queues on ``resume`` only
    when the flow really was suspended (faust-streaming 0.15.3).

    Faust's ``resume()`` empties the queues every time it is called. After a
    rebalance that needs no table recovery, Faust resumes the flow once when
    recovery ends and again when the stream partitions are resumed; events
    fetched in between would be dropped from the queue and, for a partition
    with no committed offset, never fetched again (aiokafka only seeks back
    when the committed offset is above 0). Queues hold events of an old
    generation only after a suspension, so that is when they are emptied.
    Events fetched twice are harmless: the engine ignores a seq it has seen.
    """

    def resume(self) -> None:
        if not self.is_active():
            super().resume()


class WorkerApp(faust.App):
    """The worker's Faust app: its flow control, and the intake its transport
    (``loopwarden://``, streams/worker/transport.py) feeds the events topic to."""

    intake: Processor | None = None
    #: ``--fetch-hold`` in seconds (transport.FetchPacer); 0: never held.
    fetch_hold = 0.0
    #: ``--changelog-compression`` (transport.Producer.records_codec).
    changelog_compression = "none"
    # Faust's own lines stay under the faust logger (held at --faust-loglevel);
    # mode would otherwise name a subclass's logger after this module.
    logger = logging.getLogger("faust.loopwarden.app")

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return FlowControl(loop=self.loop)


#: Young-generation collections every 50,000 net allocations instead of 700,
#: and full ones rarely: a gateway waits while the worker collects.
GC_THRESHOLDS = (50_000, 50, 1_000)


def settle_gc() -> None:
    """Once the worker runs: move what start-up built (Faust, the app, the
    modules) out of the collector's way, and collect young objects in larger,
    rarer passes. Measured in bench/README.md ("Decision latency"): p99 at
    2,000 calls/s about halved."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


#: What every loopwarden Faust app shares (the worker and the fleet stage):
#: values stay the bytes of schemas/ (its codec decodes them), tables live in
#: loopwarden's RocksDB store, no leader topic (nothing uses Faust's leader
#: election), a new group starts from the earliest offsets, so nothing
#: published before the first start is skipped, and every write waits for all
#: in-sync replicas (their transports make the producer idempotent too).
APP_DEFAULTS: dict[str, Any] = {
    "producer_acks": -1,
    "autodiscover": False,
    "store": STORE_URL,
    "key_serializer": "raw",
    "value_serializer": "raw",
    "topic_disable_leader": True,
    "consumer_auto_offset_reset": "earliest",
}


def web_settings(port: int | None, host: str) -> dict[str, Any]:
    """Faust's web server for `/metrics` only: bound to `host` (127.0.0.1
    unless `--web-host` says otherwise; Faust binds 0.0.0.0 by default), and
    none of Faust's own pages. `/table/...` would show any run's stored
    history, and `/router`, `/graph` and the stats more of the worker, to
    anyone who reaches the port, past every ACL."""
    return {
        "web_enabled": port is not None,
        "web_port": port or 6066,
        "web_bind": host,
        "web_host": host,
        "web_tables_enabled": False,
        "web_router_enabled": False,
        "web_graph_enabled": False,
        "web_stats_enabled": False,
        "web_metrics_enabled": False,
    }


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
    from streams.worker.topics import replication_configs

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


def log_rebalances(app: faust.App, logger: logging.Logger, topic: str) -> None:
    """One line when the group assigns this process its partitions of `topic`,
    and one when its tables are recovered and it takes events again: a
    (re)start that stalls then says at which of the two steps."""

    def say(message: str, event: str) -> None:
        mine = ",".join(str(tp.partition) for tp in sorted(app.assignor.assigned_actives()) if tp.topic == topic)
        logs.event(logger, logging.INFO, message, event=event, topic=topic, partitions=mine or "none")

    @app.on_partitions_assigned.connect
    async def _assigned(sender: Any, assigned: Any = (), **kwargs: Any) -> None:
        say("partitions assigned", "assigned")

    @app.on_rebalance_complete.connect
    async def _ready(sender: Any, **kwargs: Any) -> None:
        say("tables recovered; taking events", "ready")


class Worker(FaustWorker):
    """Faust's worker (its log lines keep the name), with two changes to how a
    signal (SIGTERM, SIGINT) stops it. Neither can lose an event: one is
    acknowledged only once its verdict is delivered.

    - An error raised while the signal stops the start-up is the stop, not a
      failure: exit 0. Faust stops every service, also those still starting,
      and one can fail instead of stopping. Seen while the table's changelog
      topic is declared: the conductor awaits the same declaration, the stop
      cancels its task and with it the future it shares with the declaration
      (mode's ``StampedeWrapper``), whose ``set_result`` then raises
      InvalidStateError. An error raised before any signal still exits 1.
    - A stop not finished `stop_timeout` seconds after the signal ends the
      process (status 1, one `stop_overdue` error line), before the
      supervisor's grace period does and as its SIGKILL would. Seen, rarely,
      when the signal lands while the consumer is joining its group.

    Faust's worker has no public hook for a stop signal: both its SIGTERM and
    SIGINT handlers call ``_flag_as_shutdown_by_signal``, overridden here
    (checked on faust-streaming 0.15.3).
    """

    def __init__(self, app: faust.App, *, stop_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.stop_timeout = stop_timeout
        self._watchdog: threading.Timer | None = None
        self.stopped_by_signal = False

    def _flag_as_shutdown_by_signal(self) -> None:
        super()._flag_as_shutdown_by_signal()
        self.stopped_by_signal = True
        if self._watchdog is None:  # a thread: the event loop may be what is stuck
            self._watchdog = threading.Timer(self.stop_timeout, self._stop_overdue)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _stop_overdue(self) -> None:
        logs.event(
            log,
            logging.ERROR,
            f"stop not finished {format_duration(self.stop_timeout)} after the signal: exiting",
            event="stop_overdue",
            stop_timeout=self.stop_timeout,
        )
        logging.shutdown()
        os._exit(1)

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as exc:
            if not self.stopped_by_signal:
                raise
            logs.event(
                log,
                logging.WARNING,
                "start-up stopped by a signal",
                event="startup_interrupted",
                error=f"{type(exc).__name__}: {exc}"[:300],
            )


def connection_accepted(
    logger: logging.Logger,
    bootstrap: str,
    security: kafka_clients.KafkaSecurity,
    group: str | None = None,
    timeout: float = kafka_clients.DEFAULT_CONNECT_TIMEOUT,
) -> bool:
    """Whether the brokers answer within `timeout` and accept this
    connection, and this user in consumer group `group` when one is given;
    if not, one `startup_failed` line naming what failed (no answer, TLS,
    SASL, a plaintext client on TLS, the group)."""
    try:
        if group is None:
            kafka_clients.check_connection(bootstrap, security, timeout)
        else:
            kafka_clients.check_group(bootstrap, security, group)
    except kafka_clients.CannotConnect as exc:
        logs.event(logger, logging.ERROR, str(exc), event="startup_failed")
        return False
    return True


def web_port_free(logger: logging.Logger, port: int | None, host: str) -> bool:
    """Whether the web server can listen on `host:port` (None: no web server); if
    not, one `startup_failed` line, before Faust would fail on it with a traceback."""
    if port is None:
        return True
    try:
        listen.check_free(host, port)
    except listen.CannotListen as exc:
        logs.event(logger, logging.ERROR, str(exc), event="startup_failed")
        return False
    return True


def run_worker(settings: Settings) -> int:
    """``loopwarden worker``: load config, make topics, run until stopped.

    Returns the process exit code; a config error raises ConfigError (the CLI
    turns it into exit 2) before anything connects to Kafka.
    """
    from schemas.configfile import ROLLING_OFF, load_config, rolling_off
    from schemas.policyfile import load_policy
    from streams.worker.topics import TopicError, ensure_topics, log_created, replication, require_topic

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
    tenants: Found = ({}, {})
    if settings.tenant_refresh > 0:
        try:
            tenants = discover(settings.bootstrap, settings.security, partitions)
        except TopicError as exc:
            logs.event(log, logging.ERROR, str(exc), event="startup_failed")
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
