"""Typed settings of the stream processor, from command-line options and the
environment (an option given on the command line wins over its variable).

Nothing here imports Faust: the CLI builds a ``Settings`` first and only then
loads the stream stack.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from streams.engine.entry import DEFAULT_MAX_SEQ_JUMP, max_seq_jump
from streams.listen import WEB_HOST, port
from streams.argtypes import duration, format_duration, non_negative_int, positive_int
from streams.kafka.clients import DEFAULT_CONNECT_TIMEOUT, PLAINTEXT, KafkaSecurity
from streams.kafka.options import DEFAULT_BOOTSTRAP, default_bootstrap, security_from_args
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC
from streams.kafka.topics import DEFAULT_PARTITIONS, Topics

DATA_DIR_ENV = "LOOPWARDEN_DATA_DIR"
APP_ID_ENV = "LOOPWARDEN_APP_ID"

AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE = "exactly_once"
CHANGELOG_COMPRESSIONS = ("zstd", "lz4", "snappy", "gzip", "none")
"""What ``--changelog-compression`` accepts (streams.worker.transport.CODECS maps each to aiokafka's codec)."""


@dataclass(frozen=True)
class Settings:
    """Everything ``loopwarden worker`` needs besides the loop-detection config."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    security: KafkaSecurity = PLAINTEXT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    config_path: str | None = None
    policy_path: str | None = None
    app_id: str = "loopwarden"
    topics: Topics = field(default_factory=Topics)
    data_dir: Path = Path("data/worker")
    standby_replicas: int = 1
    ttl: float = 3600.0
    sweep_interval: float | None = None  # None: derived from the TTL
    processing_guarantee: str = AT_LEAST_ONCE
    batch_size: int = 10000
    flush_interval: float = 0.25
    max_in_flight: int = 20000
    linger_ms: int = 1
    changelog_compression: str = "none"
    fetch_hold: float = 0.0
    max_event_bytes: int = 1024 * 1024
    max_batch_bytes: int = 16 * 1024 * 1024
    max_seq_jump: int = DEFAULT_MAX_SEQ_JUMP  # $LOOPWARDEN_MAX_SEQ_JUMP, shared with replay, audit and explain
    session_timeout: float = 30.0
    heartbeat_interval: float = 3.0
    commit_interval: float = 2.8
    recovery_delay: float = 0.5
    stop_timeout: float = 25.0
    stats_interval: float = 60.0
    tenant_refresh: float = 30.0  # 0: serve only the worker's own topics
    create_topics: bool = True
    web_port: int | None = None
    web_host: str = WEB_HOST  # where --web-port listens
    trace_stages: Path | None = None  # benchmark diagnostics: per-verdict stage clocks (streams/worker/stages.py)
    loglevel: str = "info"
    log_format: str = "logfmt"
    faust_loglevel: str = "warning"

    @property
    def effective_sweep_interval(self) -> float:
        """How often idle runs are looked for: a tenth of the TTL, 1 s to 60 s."""
        if self.sweep_interval is not None:
            return self.sweep_interval
        return min(60.0, max(1.0, self.ttl / 10.0))

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


DEFAULTS = Settings()
"""The one place worker defaults are written; the options and their help read them."""


def add_topic_names(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--events-topic, --decisions-topic and --deadletter-topic, in a group of their own."""
    group = parser.add_argument_group("topics")
    group.add_argument("--events-topic", default=EVENTS_TOPIC, help=f"input topic (default {EVENTS_TOPIC})")
    group.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"verdict topic (default {DECISIONS_TOPIC})")
    group.add_argument(
        "--deadletter-topic", default=DEADLETTER_TOPIC, help=f"refused events (default {DEADLETTER_TOPIC})"
    )
    return group


def add_topic_options(parser: argparse.ArgumentParser) -> None:
    """The topic names and how the topics are created."""
    group = add_topic_names(parser)
    group.add_argument(
        "--partitions",
        type=positive_int,
        default=DEFAULT_PARTITIONS,
        help=f"partitions of the events topic when it is created (default {DEFAULT_PARTITIONS})",
    )
    group.add_argument("--decisions-partitions", type=positive_int, help="default: same as --partitions")
    group.add_argument("--deadletter-partitions", type=positive_int, help="default: same as --partitions")
    add_replication_option(group, "for created topics")


def add_replication_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """--replication-factor: by default, what the cluster allows (docs/OPERATIONS.md, "A replicated cluster")."""
    parser.add_argument(
        "--replication-factor",
        type=positive_int,
        help=f"{what} (default: one replica per broker up to 3, with min.insync.replicas=2 at 3; "
        "counted at start-up from the cluster metadata)",
    )


def topics_from_args(args: argparse.Namespace) -> Topics:
    return Topics(
        events=args.events_topic,
        decisions=args.decisions_topic,
        deadletter=args.deadletter_topic,
        partitions=args.partitions,
        decisions_partitions=args.decisions_partitions,
        deadletter_partitions=args.deadletter_partitions,
        replication_factor=args.replication_factor,
    )


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``loopwarden worker`` (and ``loopwarden up``) beyond topics."""
    parser.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    parser.add_argument(
        "--policy", help="policy file (JSON/JSON5: shadow mode, escalation, budget); default $LOOPWARDEN_POLICY"
    )
    parser.add_argument(
        "--app-id",
        help=f"consumer group and table namespace (default ${APP_ID_ENV} or loopwarden)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"where RocksDB keeps the run tables (default ${DATA_DIR_ENV} or ./data/worker)",
    )
    parser.add_argument(
        "--standby-replicas",
        type=non_negative_int,
        default=DEFAULTS.standby_replicas,
        help=f"warm copies of each table partition kept by other workers (default {DEFAULTS.standby_replicas})",
    )
    _duration_option(parser, "--ttl", "ttl", "expire runs idle this long", "; e.g. 30m, 2h")
    parser.add_argument(
        "--sweep-interval", type=duration, help="how often to expire idle runs (default TTL/10, 1s-60s)"
    )
    parser.add_argument(
        "--processing-guarantee",
        choices=(AT_LEAST_ONCE, EXACTLY_ONCE),
        default=DEFAULTS.processing_guarantee,
        help=f"{AT_LEAST_ONCE} or {EXACTLY_ONCE} (Kafka transactions); default {DEFAULTS.processing_guarantee}, "
        "see docs/PROCESSING.md",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULTS.batch_size,
        help=f"max events finished together (default {DEFAULTS.batch_size})",
    )
    _duration_option(
        parser,
        "--flush-interval",
        "flush_interval",
        "how long a batch gathers events before the states it left are stored; "
        "a run touched many times meanwhile is stored once",
    )
    parser.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=DEFAULTS.max_in_flight,
        help=f"max events fetched but not yet finished before fetching pauses (default {DEFAULTS.max_in_flight})",
    )
    parser.add_argument(
        "--linger",
        type=duration,
        default=DEFAULTS.linger_ms / 1000,
        help=f"producer batching delay for verdicts (default {DEFAULTS.linger_ms}ms; 0 sends at once)",
    )
    parser.add_argument(
        "--changelog-compression",
        choices=CHANGELOG_COMPRESSIONS,
        default=DEFAULTS.changelog_compression,
        help=f"compression of the run states sent to the table's changelog (default {DEFAULTS.changelog_compression}; "
        "zstd stores them in about half the bytes for some CPU, and needs Kafka 2.1 or later)",
    )
    _duration_option(
        parser,
        "--fetch-hold",
        "fetch_hold",
        "while events stream in (two or more per hold), the broker holds each fetch up to this long to fill it: "
        "fewer, fuller fetches, less CPU per event, a longer median wait; 0 never holds",
    )
    parser.add_argument(
        "--max-event-bytes",
        type=positive_int,
        default=DEFAULTS.max_event_bytes,
        help=f"larger events are dead-lettered (default {DEFAULTS.max_event_bytes / 2**20:g} MiB)",
    )
    parser.add_argument(
        "--max-batch-bytes",
        type=positive_int,
        default=DEFAULTS.max_batch_bytes,
        help="a compressed batch of events that decompresses to more is dead-lettered whole, decompressed no "
        f"further; at least --max-event-bytes (default {DEFAULTS.max_batch_bytes / 2**20:g} MiB)",
    )
    _duration_option(parser, "--session-timeout", "session_timeout", "consumer group session")
    _duration_option(parser, "--heartbeat-interval", "heartbeat_interval", "consumer heartbeat")
    _duration_option(parser, "--commit-interval", "commit_interval", "offset commit interval")
    _duration_option(parser, "--recovery-delay", "recovery_delay", "wait after a rebalance before table recovery")
    _duration_option(
        parser,
        "--stop-timeout",
        "stop_timeout",
        "after SIGTERM or SIGINT, exit (status 1) if the stop has not finished by then, as a SIGKILL would: "
        "nothing acknowledged is lost; below the supervisor's grace period",
    )
    _duration_option(parser, "--stats-interval", "stats_interval", "summary log line period")
    _duration_option(
        parser,
        "--tenant-refresh",
        "tenant_refresh",
        "how often to look for tenants' topics (loopwarden.NAME.events) to serve besides the worker's own; "
        "0 serves only the worker's own",
    )
    parser.add_argument("--no-create-topics", action="store_true", help="do not create missing topics at start-up")
    parser.add_argument("--web-port", type=port, help="serve GET /metrics on this port (default: no web server)")
    add_web_host_option(parser)
    parser.add_argument(
        "--trace-stages",
        type=Path,
        metavar="FILE",
        help="diagnostics for benchmarks: append every verdict's stage clocks (fetched, taken, sent, acknowledged) "
        "to FILE; costs CPU per verdict (default: off)",
    )
    parser.add_argument(
        "-l", "--loglevel", default=DEFAULTS.loglevel, help=f"debug, info, warning, error (default {DEFAULTS.loglevel})"
    )
    parser.add_argument(
        "--log-format", choices=("logfmt", "json"), default=DEFAULTS.log_format, help=f"default {DEFAULTS.log_format}"
    )
    parser.add_argument(
        "--faust-loglevel",
        default=DEFAULTS.faust_loglevel,
        help=f"level of faust/aiokafka's own loggers (default {DEFAULTS.faust_loglevel})",
    )


def add_web_host_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--web-host",
        default=DEFAULTS.web_host,
        help=f"address --web-port listens on (default {DEFAULTS.web_host}: this machine only)",
    )


def _duration_option(parser: argparse.ArgumentParser, flag: str, name: str, text: str, example: str = "") -> None:
    """An option taking a duration, its default the Settings field `name`."""
    default = getattr(DEFAULTS, name)
    parser.add_argument(
        flag, type=duration, default=default, help=f"{text} (default {format_duration(default)}{example})"
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        bootstrap=default_bootstrap(args.bootstrap),
        security=security_from_args(args),
        connect_timeout=args.connect_timeout,
        config_path=args.config,
        policy_path=args.policy,
        app_id=args.app_id or os.environ.get(APP_ID_ENV) or "loopwarden",
        topics=topics_from_args(args),
        data_dir=(args.data_dir or Path(os.environ.get(DATA_DIR_ENV) or "data/worker")).resolve(),
        standby_replicas=args.standby_replicas,
        ttl=args.ttl,
        sweep_interval=args.sweep_interval,
        processing_guarantee=args.processing_guarantee,
        batch_size=args.batch_size,
        flush_interval=args.flush_interval,
        max_in_flight=args.max_in_flight,
        linger_ms=int(round(args.linger * 1000)),
        changelog_compression=args.changelog_compression,
        fetch_hold=args.fetch_hold,
        max_event_bytes=args.max_event_bytes,
        max_batch_bytes=args.max_batch_bytes,
        max_seq_jump=max_seq_jump(),
        session_timeout=args.session_timeout,
        heartbeat_interval=args.heartbeat_interval,
        commit_interval=args.commit_interval,
        recovery_delay=args.recovery_delay,
        stop_timeout=args.stop_timeout,
        stats_interval=args.stats_interval,
        tenant_refresh=args.tenant_refresh,
        create_topics=not args.no_create_topics,
        web_port=args.web_port,
        web_host=args.web_host,
        trace_stages=args.trace_stages,
        loglevel=args.loglevel,
        log_format=args.log_format,
        faust_loglevel=args.faust_loglevel,
    )


def worker_argv(settings: Settings) -> list[str]:
    """``loopwarden worker`` options that reproduce these settings (for a
    worker started as a subprocess, e.g. by ``loopwarden up``)."""
    topics = settings.topics
    argv = [
        "--bootstrap",
        settings.bootstrap,
        "--connect-timeout",
        format_duration(settings.connect_timeout),
        "--app-id",
        settings.app_id,
        "--events-topic",
        topics.events,
        "--decisions-topic",
        topics.decisions,
        "--deadletter-topic",
        topics.deadletter,
        "--partitions",
        str(topics.partitions),
        "--data-dir",
        str(settings.data_dir),
        "--standby-replicas",
        str(settings.standby_replicas),
        "--ttl",
        format_duration(settings.ttl),
        "--processing-guarantee",
        settings.processing_guarantee,
        "--batch-size",
        str(settings.batch_size),
        "--flush-interval",
        format_duration(settings.flush_interval),
        "--max-in-flight",
        str(settings.max_in_flight),
        "--linger",
        f"{settings.linger_ms}ms",
        "--changelog-compression",
        settings.changelog_compression,
        "--fetch-hold",
        format_duration(settings.fetch_hold),
        "--max-event-bytes",
        str(settings.max_event_bytes),
        "--max-batch-bytes",
        str(settings.max_batch_bytes),
        "--session-timeout",
        format_duration(settings.session_timeout),
        "--heartbeat-interval",
        format_duration(settings.heartbeat_interval),
        "--commit-interval",
        format_duration(settings.commit_interval),
        "--recovery-delay",
        format_duration(settings.recovery_delay),
        "--stop-timeout",
        format_duration(settings.stop_timeout),
        "--stats-interval",
        format_duration(settings.stats_interval),
        "--tenant-refresh",
        format_duration(settings.tenant_refresh),
        "--loglevel",
        settings.loglevel,
        "--log-format",
        settings.log_format,
        "--faust-loglevel",
        settings.faust_loglevel,
    ]
    if topics.replication_factor is not None:
        argv += ["--replication-factor", str(topics.replication_factor)]
    if topics.decisions_partitions:
        argv += ["--decisions-partitions", str(topics.decisions_partitions)]
    if topics.deadletter_partitions:
        argv += ["--deadletter-partitions", str(topics.deadletter_partitions)]
    if settings.config_path:
        argv += ["--config", settings.config_path]
    if settings.policy_path:
        argv += ["--policy", settings.policy_path]
    if settings.sweep_interval is not None:
        argv += ["--sweep-interval", format_duration(settings.sweep_interval)]
    if not settings.create_topics:
        argv.append("--no-create-topics")
    if settings.web_port is not None:
        argv += ["--web-port", str(settings.web_port), "--web-host", settings.web_host]
    if settings.trace_stages is not None:
        argv += ["--trace-stages", str(settings.trace_stages)]
    return argv + settings.security.argv()
