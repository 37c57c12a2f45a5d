"""`loopwarden` command line. Each command imports only what it needs, so the
offline commands never pay for the stream stack."""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from schemas.policy import PolicyError
from streams.engine.config import ConfigError
from streams.kafka_clients import ConnectionRefused, KafkaUnreachable, SecurityError
from streams.helptext import add_command
from streams.listen import port

if TYPE_CHECKING:
    from streams.tools.replay import Refusals

#: What stops a command before it starts (exit 2), and how its message begins
#: (nothing where the message names the problem itself).
START_UP_ERRORS: dict[type[Exception], str] = {
    ConfigError: "config error",
    PolicyError: "policy error",
    SecurityError: "security settings",
    ConnectionRefused: "Kafka refused the connection",
    KafkaUnreachable: "",
}

#: The Kafka clients' own loggers: their retries, reconnections and metadata
#: refreshes, which only --verbose shows.
KAFKA_CLIENT_LOGGERS = ("kafka", "aiokafka")

POLICY_HELP = "policy file (JSON/JSON5: shadow mode, escalation, budget); default $LOOPWARDEN_POLICY"


def _events_command(
    args: argparse.Namespace, command: str, run: Callable[[Iterable[bytes], Refusals], list[str]]
) -> int:
    """Run `run` over the events file (or stdin), with a bar on a terminal,
    then say what it read and decided; `run` returns the summary's middle
    parts. Exit 1 when lines were refused, 2 when the file is unreadable."""
    from streams.tools.progress import read_lines
    from streams.tools.replay import Refusals

    try:
        stream = sys.stdin.buffer if args.events == "-" else open(args.events, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"loopwarden: cannot read events: {exc}", file=sys.stderr)
        return 2
    refusals = Refusals(sys.stderr)
    with stream:
        parts = run(read_lines(stream, sys.stderr), refusals)
    print(refusals.summary(command, *parts), file=sys.stderr)
    return 1 if refusals.dead_letters else 0


def _replay(args: argparse.Namespace) -> int:
    from schemas.configfile import load_for_cli
    from streams.tools.replay import replay

    config, policy = load_for_cli(args.config, args.policy, sys.stderr)

    def run(lines: Iterable[bytes], refusals: Refusals) -> list[str]:
        replay(lines, config, sys.stdout.buffer, sys.stderr, policy, refusals)
        return refusals.decided()

    return _events_command(args, "replay", run)


def _incidents(args: argparse.Namespace) -> int:
    import time

    from schemas.configfile import load_for_cli
    from streams.fleet.settings import incident_settings_from_args
    from streams.tools.incidents import print_incidents
    from streams.tools.progress import plural

    try:
        settings = incident_settings_from_args(args)
    except ValueError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 2
    config, policy = load_for_cli(args.config, args.policy, sys.stderr)
    now = args.now
    clock = time.time if now is None else lambda: now

    def run(lines: Iterable[bytes], refusals: Refusals) -> list[str]:
        written = print_incidents(lines, config, sys.stdout.buffer, refusals, settings, clock, policy, args.tenant)
        return [*refusals.decided(), plural(written, "incident")]

    return _events_command(args, "incidents", run)


def _exit_ok(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(0)


def _worker(args: argparse.Namespace) -> int:
    # Faust's worker handles SIGTERM (a clean stop) only once it starts, about
    # a second from here (importing Faust, creating topics); until then SIGTERM
    # would kill the process (status 143). Nothing is consumed before that, so
    # stopping is clean: exit 0. Faust's handler replaces this one.
    signal.signal(signal.SIGTERM, _exit_ok)
    from streams.worker.settings import settings_from_args

    settings = settings_from_args(args)
    from streams.worker.app import run_worker  # imports Faust

    return run_worker(settings)


def _fleet(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_ok)  # as for the worker, until Faust's handler takes over
    from streams.fleet.settings import fleet_settings_from_args

    try:
        settings = fleet_settings_from_args(args)
    except SecurityError:
        raise  # a ValueError as well; main names it as it does for every command
    except ValueError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 2
    from streams.fleet.stage import run_fleet  # imports Faust

    return run_fleet(settings)


def _topics_create(args: argparse.Namespace) -> int:
    from streams.worker.settings import connection_from_args, topics_from_args
    from streams.worker.topics import ensure_project_topics

    bootstrap, security = connection_from_args(args)
    states = ensure_project_topics(
        bootstrap,
        topics_from_args(args),
        incidents_topic=args.incidents_topic,
        incidents_partitions=args.incidents_partitions,
        timeout=args.timeout,
        security=security,
    )
    for state in states:
        print(f"{'created' if state.created else 'exists '} {state.name} ({state.describe()})")
    return 0


def _topics_list(args: argparse.Namespace) -> int:
    from streams.tools.progress import plural
    from streams.worker.settings import connection_from_args
    from streams.worker.topics import list_topics

    bootstrap, security = connection_from_args(args)
    for name, partitions in list_topics(bootstrap, timeout=args.timeout, security=security).items():
        print(f"{name} ({plural(partitions, 'partition')})")
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    from streams.tools.progress import plural
    from streams.worker.settings import connection_from_args
    from streams.worker.topics import describe, missing_topic

    bootstrap, security = connection_from_args(args)
    names = args.names or [args.events_topic, args.decisions_topic, args.deadletter_topic, args.incidents_topic]
    found = describe(bootstrap, names, timeout=args.timeout, security=security)
    for topic in found:
        leaders = " ".join(str(leader) for leader in topic.leaders)
        print(
            f"{topic.name}: {plural(topic.partitions, 'partition')}, replication factor {topic.replication_factor}, "
            f"leaders by partition: {leaders}"
        )
    missing = [name for name in names if name not in {topic.name for topic in found}]
    for name in missing:
        print(f"loopwarden: {missing_topic(name, bootstrap)}", file=sys.stderr)
    return 1 if missing else 0


def _topic_errors(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """`run`, a topics action, with a TopicError said in one line (exit 1)."""
    from streams.worker.topics import TopicError

    try:
        return run(args)
    except TopicError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 1


def _add_topics_action(
    actions: argparse._SubParsersAction, name: str, help: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A `topics` action: the connection options and one --timeout for its admin requests."""
    from streams.worker.settings import add_connection_options, duration, format_duration
    from streams.worker.topics import ADMIN_TIMEOUT

    parser = add_command(actions, name, help=help)
    add_connection_options(parser)
    parser.add_argument(
        "--timeout",
        type=duration,
        default=ADMIN_TIMEOUT,
        metavar="DURATION",
        help=f"admin request timeout (default {format_duration(ADMIN_TIMEOUT)})",
    )
    parser.set_defaults(run=functools.partial(_topic_errors, run))
    return parser


def _add_incidents_topic(parser: argparse.ArgumentParser) -> None:
    from schemas.topics import INCIDENTS_TOPIC

    parser.add_argument(
        "--incidents-topic", default=INCIDENTS_TOPIC, help=f"the fleet stage's output (default {INCIDENTS_TOPIC})"
    )


def _produce(args: argparse.Namespace) -> int:
    from streams.kafka_clients import describe_error
    from streams.tools.produce import produce_file
    from streams.tools.progress import Tally, plural
    from streams.worker.settings import connection_from_args
    from streams.worker.topics import TopicError, require_topic

    topic = args.events_topic
    bootstrap, security = connection_from_args(args)
    tally = Tally()
    try:
        require_topic(bootstrap, topic, security=security)
        report = produce_file(args.events, bootstrap, topic, raw=args.raw, security=security)
    except OSError as exc:
        print(f"loopwarden: cannot read events: {exc}", file=sys.stderr)
        return 2
    except TopicError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the broker went away, timeouts
        print(f"loopwarden: cannot produce to {topic}: {describe_error(exc)}", file=sys.stderr)
        return 1
    tally.events = report.sent + report.refused + report.failed
    parts = [f"{report.sent:,} sent to {topic}"]
    if report.refused:
        parts.append(f"{plural(report.refused, 'line')} refused")
    if report.failed:
        parts.append(f"{report.failed:,} not accepted by Kafka ({report.error})")
    print(tally.summary("produce", *parts), file=sys.stderr)
    return 1 if report.refused or report.failed else 0


def _tail(args: argparse.Namespace) -> int:
    from streams.kafka_clients import describe_error
    from streams.tools.audit import AuditError
    from streams.tools.tail import tail
    from streams.worker.settings import connection_from_args

    topic = args.topic or (args.deadletter_topic if args.deadletter else args.decisions_topic)
    bootstrap, security = connection_from_args(args)
    try:
        printed = tail(
            bootstrap,
            topic,
            sys.stdout.buffer,
            start=args.start,
            max_records=args.max,
            timeout=args.timeout,
            idle=args.idle,
            deadletter=args.deadletter,
            dedupe=args.dedupe,
            security=security,
        )
    except BrokenPipeError:
        raise
    except AuditError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # broker unreachable
        print(f"loopwarden: cannot read {topic}: {describe_error(exc)}", file=sys.stderr)
        return 1
    if args.max is not None and printed < args.max:
        return 1
    return 0


def _up(args: argparse.Namespace) -> int:
    from streams.tools.quickstart import run_up

    return run_up(args)


def _broker(args: argparse.Namespace) -> int:
    from streams.tools.broker import run_broker_command

    return run_broker_command(args)


def _audit(args: argparse.Namespace) -> int:
    from streams.tools.audit import main as audit_main
    from streams.worker.settings import connection_from_args

    args.bootstrap, args.security = connection_from_args(args)
    return audit_main(args)


def _explain(args: argparse.Namespace) -> int:
    from streams.tools.explain import main as explain_main

    return explain_main(args)


def _dashboard(args: argparse.Namespace) -> int:
    from streams.tools.dashboard import main as dashboard_main

    return dashboard_main(args)


def _tenant_name(text: str) -> str:
    """A tenant's name, as `loopwarden tenants add` takes it."""
    from schemas.topics import tenant_topics

    try:
        tenant_topics(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _start_point(text: str) -> str:
    """earliest, latest, or a point `audit --since` reads (checked now, resolved when the page starts reading)."""
    if text in ("earliest", "latest"):
        return text
    from streams.tools.audit import AuditError, parse_since

    try:
        parse_since(text)
    except AuditError:
        raise argparse.ArgumentTypeError(
            f"expected earliest, latest, a time (2026-05-01T10:00:00Z, epoch s/ms) or a duration ago (15m), got {text!r}"
        ) from None
    return text


def _add_start(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    """--from, the one spelling of where a command starts reading, with the
    older spellings --from-beginning and --since kept as its aliases."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--from",
        dest="start",
        type=_start_point,
        default=default,
        metavar="START",
        help=f"where to start reading {what}: earliest, latest, a time (2026-05-01T10:00:00Z, epoch s/ms) "
        f"or a duration ago (15m) (default {default})",
    )
    group.add_argument(
        "--from-beginning", dest="start", action="store_const", const="earliest", help="the same as --from earliest"
    )
    group.add_argument("--since", dest="start", type=_start_point, metavar="START", help="the same as --from START")


DESCRIPTION = (
    "Stops AI agents from burning tokens in tool-call loops, fleet-wide: gateways publish their agents' tool "
    "calls to Kafka, a stream processor answers each with a verdict (allow, warn, block, abort). "
    "Try it with `loopwarden up --demo`; `loopwarden COMMAND --help` describes each command."
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopwarden")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopwarden", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = add_command(commands, "replay", help="recompute verdicts for a JSON-lines event file, offline")
    replay.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    replay.add_argument("--policy", help=POLICY_HELP)
    replay.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    replay.set_defaults(run=_replay)

    from streams.fleet.settings import add_incident_options

    incidents = add_command(
        commands, "incidents", help="the incidents the fleet stage would publish for a JSON-lines event file, offline"
    )
    incidents.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    incidents.add_argument("--policy", help=POLICY_HELP)
    add_incident_options(incidents)
    incidents.add_argument(
        "--now",
        type=float,
        metavar="SECONDS",
        help="processing time given to verdicts whose event has no ts, in seconds since the epoch "
        "(default: the clock as each is read, as the stage does)",
    )
    incidents.add_argument(
        "--tenant",
        type=_tenant_name,
        help="the tenant whose events these are (published to loopwarden.NAME.events): its incidents carry it,"
        " as the stage's do (default: the default topic pair, tenant null)",
    )
    incidents.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    incidents.set_defaults(run=_incidents)

    from schemas.topics import (
        DEADLETTER_TOPIC,
        DECISIONS_TOPIC,
        DECISIONS_TOPIC_ENV,
        EVENTS_TOPIC,
        EVENTS_TOPIC_ENV,
        INCIDENTS_TOPIC,
        decisions_topic,
        events_topic,
    )
    from streams.worker.settings import (
        add_connection_options,
        add_reach_options,
        add_security_options,
        add_topic_names,
        add_topic_options,
        add_worker_options,
        duration,
        positive_int,
    )

    worker = add_command(commands, "worker", help="run the stream processor (a Faust worker)")
    add_connection_options(worker, verbose=False)
    add_topic_options(worker)
    add_worker_options(worker)
    worker.set_defaults(run=_worker)

    from streams.fleet.settings import add_fleet_options

    fleet = add_command(
        commands, "fleet", help="run the fleet stage: block and abort verdicts regrouped by fingerprint into incidents"
    )
    add_connection_options(fleet, verbose=False)
    add_fleet_options(fleet)
    fleet.set_defaults(run=_fleet)

    topics = add_command(commands, "topics", help="manage the project's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = _add_topics_action(
        topic_commands, "create", "create the events, decisions, dead-letter and incident topics", _topics_create
    )
    add_topic_options(create)
    _add_incidents_topic(create)
    create.add_argument(
        "--incidents-partitions",
        type=positive_int,
        help="default: same as --partitions (keep it equal to the fleet stage's --partitions)",
    )
    _add_topics_action(
        topic_commands, "list", "list the topics on the brokers with their partition counts", _topics_list
    )
    describing = _add_topics_action(
        topic_commands,
        "describe",
        "partitions, replication factor and leaders of topics (default the project's)",
        _topics_describe,
    )
    describing.add_argument("names", nargs="*", metavar="TOPIC", help="topics to describe (default the project's four)")
    add_topic_names(describing)
    _add_incidents_topic(describing)

    produce = add_command(commands, "produce", help="publish a JSON-lines trace to the events topic, keyed by run_id")
    add_connection_options(produce)
    produce.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    produce.add_argument(
        "--events-topic",
        "--topic",
        default=events_topic(),
        help=f"the topic to publish to (default ${EVENTS_TOPIC_ENV} or {EVENTS_TOPIC})",
    )
    produce.add_argument(
        "--raw", action="store_true", help="send every line verbatim, unvalidated (bad lines included)"
    )
    produce.set_defaults(run=_produce)

    tail = add_command(commands, "tail", help="print verdicts (or dead letters) as they arrive, one JSON per line")
    add_connection_options(tail)
    tail.add_argument(
        "--decisions-topic", default=decisions_topic(), help=f"default ${DECISIONS_TOPIC_ENV} or {DECISIONS_TOPIC}"
    )
    tail.add_argument("--deadletter-topic", default=DEADLETTER_TOPIC, help=f"default {DEADLETTER_TOPIC}")
    tail.add_argument("--topic", help="tail this topic instead")
    tail.add_argument("--deadletter", action="store_true", help="tail the dead-letter topic, with reasons")
    _add_start(tail, "latest", "the topic")
    tail.add_argument("--max", type=positive_int, help="stop after N records (exit 1 if fewer arrived)")
    tail.add_argument("--timeout", type=duration, help="stop after this long in all (e.g. 30s)")
    tail.add_argument("--idle", type=duration, help="stop after this long without a record")
    tail.add_argument("--dedupe", action="store_true", help="print each (run_id, seq) verdict once")
    tail.set_defaults(run=_tail)

    up = add_command(
        commands, "up", help="start a local broker if none answers, create topics, run a worker (and a demo trace)"
    )
    add_connection_options(up, verbose=False)
    add_topic_options(up)
    add_worker_options(up)
    from streams.tools.quickstart import SAMPLE_TRACE

    up.add_argument(
        "--demo",
        metavar="EVENTS.jsonl",
        nargs="?",
        const=str(SAMPLE_TRACE),
        help="publish this trace (with no file: the sample trace loopwarden ships), print its verdicts, then exit",
    )
    up.add_argument(
        "--dashboard",
        metavar="PORT",
        type=port,
        help="also run the fleet stage and the operator page on 127.0.0.1:PORT (with --demo: keep running after it)",
    )
    up.add_argument(
        "--broker-dir",
        help="data dir of a broker started here (default ./data/kafka, else ~/.cache/loopwarden/kafka)",
    )
    up.add_argument("--demo-timeout", type=duration, default=120.0, help="give up on the demo after (default 2m)")
    up.add_argument(
        "--secure",
        action="store_true",
        help="start the local broker with TLS, SASL/SCRAM and ACLs; the worker and the demo connect "
        "as the worker and gateway roles (docs/SECURITY.md)",
    )
    up.set_defaults(run=_up)

    from streams.tools.broker import add_broker_commands
    from streams.tools.tenants import add_tenants_command

    broker = add_command(
        commands,
        "broker",
        help="install, start, stop or query a local Kafka broker (or a local cluster: --nodes 3)",
        description="Install, start, stop or query a local Kafka broker, or a local cluster of several nodes "
        "(`start --nodes 3`). `start` leaves it running in the background and prints its bootstrap address "
        "(every node's, comma-separated, for a cluster) on its last line.",
    )
    add_broker_commands(broker)
    broker.set_defaults(run=_broker)
    add_tenants_command(commands)

    audit = add_command(
        commands, "audit", help="recompute verdicts from the events topic and compare them with the published ones"
    )
    add_connection_options(audit)
    _add_start(audit, "earliest", "the events topic")
    audit.add_argument("--run", dest="run_filter", metavar="RUN_ID", help="audit only this run")
    audit.add_argument("--config", help="config to recompute with (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    audit.add_argument("--policy", help=POLICY_HELP)
    audit.add_argument("--events-topic", default=EVENTS_TOPIC, help=f"default {EVENTS_TOPIC}")
    audit.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"default {DECISIONS_TOPIC}")
    audit.add_argument(
        "--wait", type=duration, default=5.0, help="wait this long for verdicts still missing (default 5s)"
    )
    audit.add_argument(
        "--first-seq",
        type=int,
        default=0,
        help="with --from a time: a run whose first event after the point has a higher seq started before it "
        "and is not compared (default 0; 1 for gateways that number runs from 1)",
    )
    audit.add_argument("--summary-only", action="store_true", help="do not list each mismatch")
    audit.add_argument("--json", action="store_true", help="print the report as one JSON document")
    audit.set_defaults(run=_audit)

    explain = add_command(commands, "explain", help="show one run's timeline: hashes, detector counts, verdicts")
    explain.add_argument("run_id", metavar="RUN_ID", help="the run to show, as its events name it")
    source = explain.add_mutually_exclusive_group()
    source.add_argument("--events", metavar="FILE.jsonl", help="read events from a JSON-lines file (- for stdin)")
    source.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="read the run from the topics (default when --events is not given: $LOOPWARDEN_BOOTSTRAP or 127.0.0.1:9092)",
    )
    explain.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    explain.add_argument("--policy", help=POLICY_HELP)
    explain.add_argument("--events-topic", default=EVENTS_TOPIC, help=f"default {EVENTS_TOPIC}")
    explain.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"default {DECISIONS_TOPIC}")
    explain.add_argument("--json", action="store_true", help="one JSON object per event instead of the table")
    add_reach_options(explain)
    add_security_options(explain)
    explain.set_defaults(run=_explain)

    dashboard = add_command(
        commands,
        "dashboard",
        help="serve a live page: verdicts per minute, incidents, blocks and aborts, runs in flight",
    )
    add_connection_options(dashboard, verbose=False, connect_timeout=False)  # a page waits for its brokers
    dashboard.add_argument("--port", type=port, default=8080, help="HTTP port (default 8080)")
    dashboard.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); any other than a loopback one needs --token-file",
    )
    dashboard.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name browsers reach the page by, accepted in the Host header (repeatable); --host and, on a"
        " loopback or wildcard address, localhost are accepted, as is the address a request reached",
    )
    dashboard.add_argument(
        "--token-file",
        help="a file holding the access token (16+ characters): browsers open /?token=TOKEN once, other clients"
        " send Authorization: Bearer TOKEN; default $LOOPWARDEN_DASHBOARD_TOKEN_FILE, else no token",
    )
    _add_start(dashboard, "1h", "the decision and incident topics")
    dashboard.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"default {DECISIONS_TOPIC}")
    dashboard.add_argument("--incidents-topic", default=INCIDENTS_TOPIC, help=f"default {INCIDENTS_TOPIC}")
    dashboard.add_argument(
        "--events-topic", default=EVENTS_TOPIC, help=f"read by a run's timeline (default {EVENTS_TOPIC})"
    )
    dashboard.add_argument(
        "--tenant-refresh",
        type=duration,
        default=30.0,
        help="how often to look for tenants' decisions topics (loopwarden.NAME.decisions) to show besides"
        " --decisions-topic; 0 shows only that one (default 30s)",
    )
    dashboard.add_argument(
        "--explain-window",
        type=duration,
        default=3600.0,
        help="how far back a clicked run's timeline is read from the topics; 0 reads them from the start (default 1h)",
    )
    dashboard.add_argument("--config", help="config the timelines are recomputed with; default $LOOPWARDEN_CONFIG")
    dashboard.add_argument("--policy", help=POLICY_HELP)
    dashboard.set_defaults(run=_dashboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "verbose", True):
        for name in KAFKA_CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        return args.run(args)
    except tuple(START_UP_ERRORS) as exc:
        label = next(text for kind, text in START_UP_ERRORS.items() if isinstance(exc, kind))
        print(f"loopwarden: {label}: {exc}" if label else f"loopwarden: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
