"""Settings of the fleet stage (`loopwarden fleet`) and of its offline twin
(`loopwarden incidents`), from command-line options. Imports no Faust."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from schemas.topics import DECISIONS_TOPIC, INCIDENTS_TOPIC
from streams.fleet.incidents import IncidentSettings
from streams.kafka.clients import DEFAULT_CONNECT_TIMEOUT, PLAINTEXT, KafkaSecurity
from streams.listen import WEB_HOST, port
from streams.argtypes import duration, format_duration, non_negative_int, positive_int
from streams.kafka.options import default_bootstrap, security_from_args
from streams.worker.settings import DATA_DIR_ENV, add_replication_option, add_web_host_option
from streams.kafka.topics import DEFAULT_PARTITIONS

DEFAULTS = IncidentSettings()
#: The stage's consumer group and table namespace unless --app-id says otherwise.
FLEET_APP_ID = "loopwarden-fleet"
#: The tally table's name: its changelog topic is `<app-id>-incidents-changelog`.
TABLE_NAME = "incidents"


def whole_seconds(text: str) -> int:
    """A positive number of whole seconds, as `duration` reads it (15m, 900)."""
    seconds = duration(text)
    if seconds < 1 or not float(seconds).is_integer():
        raise argparse.ArgumentTypeError(f"expected whole seconds (at least 1s), got {text!r}")
    return int(seconds)


def whole_seconds_or_none(text: str) -> int:
    """The same, or 0."""
    return 0 if duration(text) == 0 else whole_seconds(text)


def add_incident_options(parser: argparse.ArgumentParser) -> None:
    """How verdicts become incidents: the same options for the stage and the offline command."""
    group = parser.add_argument_group("incidents")
    group.add_argument(
        "--window",
        type=whole_seconds,
        default=DEFAULTS.window,
        help=f"tumbling window of event time (default {format_duration(DEFAULTS.window)})",
    )
    group.add_argument(
        "--min-runs",
        type=positive_int,
        default=DEFAULTS.min_runs,
        help=f"distinct runs that open an incident (default {DEFAULTS.min_runs})",
    )
    group.add_argument(
        "--max-runs",
        type=positive_int,
        default=DEFAULTS.max_runs,
        help=f"cap on the distinct runs a window keeps (default {DEFAULTS.max_runs})",
    )
    group.add_argument(
        "--lateness",
        type=whole_seconds_or_none,
        default=DEFAULTS.lateness,
        help="how long after its end a window still takes verdicts, in event time "
        f"(default {format_duration(DEFAULTS.lateness)})",
    )


def incident_settings_from_args(args: argparse.Namespace) -> IncidentSettings:
    """Raises ValueError naming the option combination that does not hold."""
    return IncidentSettings(window=args.window, min_runs=args.min_runs, max_runs=args.max_runs, lateness=args.lateness)


@dataclass(frozen=True)
class FleetSettings:
    """Everything `loopwarden fleet` needs."""

    bootstrap: str
    security: KafkaSecurity = PLAINTEXT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    incidents: IncidentSettings = field(default_factory=IncidentSettings)
    app_id: str = FLEET_APP_ID
    decisions_topic: str = DECISIONS_TOPIC
    incidents_topic: str = INCIDENTS_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    data_dir: Path = Path("data/fleet")
    standby_replicas: int = 1
    replication_factor: int | None = None  # None: from the cluster (streams.kafka.topics.replication)
    ttl: float = 3 * 3600.0
    tenant_refresh: float = 30.0  # 0: read only --decisions-topic
    session_timeout: float = 30.0
    commit_interval: float = 2.8
    loglevel: str = "info"
    faust_loglevel: str = "warning"
    web_port: int | None = None
    web_host: str = WEB_HOST  # where --web-port listens

    @property
    def repartition_topic(self) -> str:
        """Named after the app, so two stages on one decision topic never share it."""
        return f"{self.app_id}-fingerprint-repartition"

    @property
    def changelog_topic(self) -> str:
        """The tally table's changelog, as Faust names it."""
        return f"{self.app_id}-{TABLE_NAME}-changelog"

    def __post_init__(self) -> None:
        held = self.incidents.window * 2 + self.incidents.lateness
        if self.ttl < held:
            raise ValueError(
                f"--ttl ({format_duration(self.ttl)}) must cover a window and its lateness: at least {format_duration(held)}"
            )


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    add_incident_options(parser)
    parser.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"input (default {DECISIONS_TOPIC})")
    parser.add_argument("--incidents-topic", default=INCIDENTS_TOPIC, help=f"output (default {INCIDENTS_TOPIC})")
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=DEFAULT_PARTITIONS,
        help="partitions of the fingerprint topics (repartition, table, incidents) when created "
        f"(default {DEFAULT_PARTITIONS}): the stage's unit of scale",
    )
    parser.add_argument(
        "--app-id", default=FLEET_APP_ID, help=f"consumer group and table namespace (default {FLEET_APP_ID})"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"where RocksDB keeps the incident table (default ${DATA_DIR_ENV}/../fleet or ./data/fleet)",
    )
    parser.add_argument(
        "--standby-replicas", type=non_negative_int, default=1, help="warm copies of each table partition (default 1)"
    )
    add_replication_option(parser, "for the topics the stage creates")
    parser.add_argument(
        "--ttl",
        type=duration,
        default=3 * 3600.0,
        help="forget a fingerprint unchanged this long, wall clock (default 3h)",
    )
    parser.add_argument(
        "--tenant-refresh",
        type=duration,
        default=30.0,
        help="how often to look for tenants' decisions topics (loopwarden.NAME.decisions) to read besides "
        "--decisions-topic; 0 reads only that one (default 30s)",
    )
    parser.add_argument(
        "--session-timeout",
        type=duration,
        default=30.0,
        help="how long the group waits for a stage that stopped answering before its partitions move (default 30s)",
    )
    parser.add_argument(
        "--commit-interval",
        type=duration,
        default=2.8,
        help="how often the offsets of the verdicts taken are committed; a restart takes again those after "
        "the last commit (default 2.8s)",
    )
    parser.add_argument(
        "--loglevel", default="info", choices=("debug", "info", "warning", "error"), help="log level (default info)"
    )
    parser.add_argument(
        "--faust-loglevel",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="level of faust/aiokafka's own loggers (default warning)",
    )
    parser.add_argument(
        "--web-port", type=port, help="serve GET /metrics (Prometheus) on this port (default: no web server)"
    )
    add_web_host_option(parser)


def fleet_settings_from_args(args: argparse.Namespace) -> FleetSettings:
    """Raises ValueError for options that do not hold together, SecurityError for security settings."""
    data_dir = args.data_dir
    if data_dir is None:
        worker_dir = os.environ.get(DATA_DIR_ENV)
        data_dir = Path(worker_dir).parent / "fleet" if worker_dir else Path("data/fleet")
    return FleetSettings(
        bootstrap=default_bootstrap(args.bootstrap),
        security=security_from_args(args),
        connect_timeout=args.connect_timeout,
        incidents=incident_settings_from_args(args),
        app_id=args.app_id,
        decisions_topic=args.decisions_topic,
        incidents_topic=args.incidents_topic,
        partitions=args.partitions,
        data_dir=data_dir.resolve(),
        standby_replicas=args.standby_replicas,
        replication_factor=args.replication_factor,
        ttl=args.ttl,
        tenant_refresh=args.tenant_refresh,
        session_timeout=args.session_timeout,
        commit_interval=args.commit_interval,
        loglevel=args.loglevel,
        faust_loglevel=args.faust_loglevel,
        web_port=args.web_port,
        web_host=args.web_host,
    )
