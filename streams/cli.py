"""`loopwarden` command line. Each command imports only what it needs, so the
offline commands never pay for the stream stack."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import BinaryIO, NoReturn

from schemas.policy import PolicyError
from streams.engine.config import ConfigError
from streams.kafka_clients import ConnectionRefused, SecurityError

#: What stops a command before it starts (exit 2), and how its message begins.
START_UP_ERRORS: dict[type[Exception], str] = {
    ConfigError: "config error",
    PolicyError: "policy error",
    SecurityError: "security settings",
    ConnectionRefused: "Kafka refused the connection",
}

POLICY_HELP = "policy file (JSON/JSON5: shadow mode, escalation, budget); default $LOOPWARDEN_POLICY"


def _events_command(args: argparse.Namespace, run: Callable[[BinaryIO], int]) -> int:
    """Run `run` over the events file (or stdin); exit 1 when it refused lines, 2 when unreadable."""
    if args.events == "-":
        return 1 if run(sys.stdin.buffer) else 0
    try:
        with open(args.events, "rb") as lines:
            refused = run(lines)
    except OSError as exc:
        print(f"loopwarden: cannot read events: {exc}", file=sys.stderr)
        return 2
    return 1 if refused else 0


def _replay(args: argparse.Namespace) -> int:
    from schemas.configfile import load_config_for_cli
    from schemas.policyfile import load_policy
    from streams.tools.replay import replay

    config = load_config_for_cli(args.config, sys.stderr)
    policy = load_policy(args.policy)
    return _events_command(args, lambda lines: replay(lines, config, sys.stdout.buffer, sys.stderr, policy))


def _incidents(args: argparse.Namespace) -> int:
    import time

    from schemas.configfile import load_config_for_cli
    from schemas.policyfile import load_policy
    from streams.fleet.settings import incident_settings_from_args
    from streams.tools.incidents import print_incidents

    try:
        settings = incident_settings_from_args(args)
    except ValueError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 2
    config = load_config_for_cli(args.config, sys.stderr)
    policy = load_policy(args.policy)
    now = args.now
    clock = time.time if now is None else lambda: now
    return _events_command(
        args, lambda lines: print_incidents(lines, config, sys.stdout.buffer, sys.stderr, settings, clock, policy)
    )


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
    from streams.worker.topics import TopicError, ensure_project_topics

    bootstrap, security = connection_from_args(args)
    try:
        states = ensure_project_topics(
            bootstrap,
            topics_from_args(args),
            incidents_topic=args.incidents_topic,
            incidents_partitions=args.incidents_partitions,
            timeout=args.timeout,
            security=security,
        )
    except TopicError as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return 1
    for state in states:
        print(f"{'created' if state.created else 'exists '} {state.name} ({state.partitions} partitions)")
    return 0


def _produce(args: argparse.Namespace) -> int:
    from streams.tools.produce import produce_file
    from streams.worker.settings import connection_from_args

    bootstrap, security = connection_from_args(args)
    try:
        report = produce_file(args.events, bootstrap, args.topic, raw=args.raw, security=security)
    except OSError as exc:
        print(f"loopwarden: cannot read events: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # broker unreachable, timeouts
        print(f"loopwarden: cannot produce to {args.topic}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(
        f"sent {report.sent} events to {args.topic}"
        + (f", refused {report.refused} bad lines" if report.refused else "")
        + (f", {report.failed} not accepted by Kafka ({report.error})" if report.failed else ""),
        file=sys.stderr,
    )
    return 1 if report.refused or report.failed else 0


def _tail(args: argparse.Namespace) -> int:
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
            from_beginning=args.from_beginning,
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
        print(f"loopwarden tail: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # broker unreachable
        print(f"loopwarden: cannot read {topic}: {type(exc).__name__}: {exc}", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopwarden", description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser("replay", help="recompute verdicts for a JSON-lines event file, offline")
    replay.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    replay.add_argument("--policy", help=POLICY_HELP)
    replay.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    replay.set_defaults(run=_replay)

    from streams.fleet.settings import add_incident_options

    incidents = commands.add_parser(
        "incidents", help="the incidents the fleet stage would publish for a JSON-lines event file, offline"
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
        add_security_options,
        add_topic_options,
        add_worker_options,
        duration,
        positive_int,
    )

    worker = commands.add_parser("worker", help="run the stream processor (a Faust worker)")
    add_connection_options(worker)
    add_topic_options(worker)
    add_worker_options(worker)
    worker.set_defaults(run=_worker)

    from streams.fleet.settings import add_fleet_options

    fleet = commands.add_parser(
        "fleet", help="run the fleet stage: block and abort verdicts regrouped by fingerprint into incidents"
    )
    add_connection_options(fleet)
    add_fleet_options(fleet)
    fleet.set_defaults(run=_fleet)

    topics = commands.add_parser("topics", help="manage the project's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", help="create the events, decisions, dead-letter and incident topics")
    add_connection_options(create)
    add_topic_options(create)
    create.add_argument(
        "--incidents-topic", default=INCIDENTS_TOPIC, help=f"the fleet stage's output (default {INCIDENTS_TOPIC})"
    )
    create.add_argument(
        "--incidents-partitions",
        type=positive_int,
        help="default: same as --partitions (keep it equal to the fleet stage's --partitions)",
    )
    create.add_argument("--timeout", type=duration, default=30.0, help="admin request timeout (default 30s)")
    create.set_defaults(run=_topics_create)

    produce = commands.add_parser("produce", help="publish a JSON-lines trace to the events topic, keyed by run_id")
    add_connection_options(produce)
    produce.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    produce.add_argument("--topic", default=events_topic(), help=f"default ${EVENTS_TOPIC_ENV} or {EVENTS_TOPIC}")
    produce.add_argument(
        "--raw", action="store_true", help="send every line verbatim, unvalidated (bad lines included)"
    )
    produce.set_defaults(run=_produce)

    tail = commands.add_parser("tail", help="print verdicts (or dead letters) as they arrive, one JSON per line")
    add_connection_options(tail)
    tail.add_argument(
        "--decisions-topic", default=decisions_topic(), help=f"default ${DECISIONS_TOPIC_ENV} or {DECISIONS_TOPIC}"
    )
    tail.add_argument("--deadletter-topic", default=DEADLETTER_TOPIC, help=f"default {DEADLETTER_TOPIC}")
    tail.add_argument("--topic", help="tail this topic instead")
    tail.add_argument("--deadletter", action="store_true", help="tail the dead-letter topic, with reasons")
    tail.add_argument("--from-beginning", action="store_true", help="start at the oldest record, not the newest")
    tail.add_argument("--max", type=positive_int, help="stop after N records (exit 1 if fewer arrived)")
    tail.add_argument("--timeout", type=duration, help="stop after this long in all (e.g. 30s)")
    tail.add_argument("--idle", type=duration, help="stop after this long without a record")
    tail.add_argument("--dedupe", action="store_true", help="print each (run_id, seq) verdict once")
    tail.set_defaults(run=_tail)

    up = commands.add_parser(
        "up", help="start a local broker if none answers, create topics, run a worker (and a demo trace)"
    )
    add_connection_options(up)
    add_topic_options(up)
    add_worker_options(up)
    up.add_argument("--demo", metavar="EVENTS.jsonl", help="publish this trace, print its verdicts, then exit")
    up.add_argument(
        "--dashboard",
        metavar="PORT",
        type=int,
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

    broker = commands.add_parser(
        "broker",
        help="install, start, stop or query the local single-node Kafka broker",
        description="Install, start, stop or query the local single-node Kafka broker. "
        "`start` leaves it running in the background and prints its bootstrap address.",
    )
    add_broker_commands(broker)
    broker.set_defaults(run=_broker)
    add_tenants_command(commands)

    audit = commands.add_parser(
        "audit", help="recompute verdicts from the events topic and compare them with the published ones"
    )
    add_connection_options(audit)
    start = audit.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="read from the oldest event (the default)")
    start.add_argument(
        "--since",
        metavar="TIMESTAMP",
        help="read from this time: ISO 8601 (2025-05-01T10:00:00Z), epoch s/ms, or a duration ago (15m, 2h)",
    )
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
        help="with --since: a run whose first event after the point has a higher seq started before it "
        "and is not compared (default 0; 1 for gateways that number runs from 1)",
    )
    audit.add_argument("--summary-only", action="store_true", help="do not list each mismatch")
    audit.add_argument("--json", action="store_true", help="print the report as one JSON document")
    audit.set_defaults(run=_audit)

    explain = commands.add_parser("explain", help="show one run's timeline: hashes, detector counts, verdicts")
    explain.add_argument("run_id", metavar="RUN_ID")
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
    add_security_options(explain)
    explain.set_defaults(run=_explain)

    dashboard = commands.add_parser(
        "dashboard", help="serve a live page: verdicts per minute, incidents, blocks and aborts, runs in flight"
    )
    add_connection_options(dashboard)
    dashboard.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    dashboard.add_argument(
        "--token-file",
        help="a file holding the access token (16+ characters): browsers open /?token=TOKEN once, other clients"
        " send Authorization: Bearer TOKEN; default $LOOPWARDEN_DASHBOARD_TOKEN_FILE, else no token",
    )
    dashboard.add_argument(
        "--from",
        dest="start",
        type=_start_point,
        default="1h",
        help="where to start reading: earliest, latest, a time or a duration ago (default 1h)",
    )
    dashboard.add_argument("--decisions-topic", default=DECISIONS_TOPIC, help=f"default {DECISIONS_TOPIC}")
    dashboard.add_argument("--incidents-topic", default=INCIDENTS_TOPIC, help=f"default {INCIDENTS_TOPIC}")
    dashboard.add_argument(
        "--events-topic", default=EVENTS_TOPIC, help=f"read by a run's timeline (default {EVENTS_TOPIC})"
    )
    dashboard.add_argument("--config", help="config the timelines are recomputed with; default $LOOPWARDEN_CONFIG")
    dashboard.add_argument("--policy", help=POLICY_HELP)
    dashboard.set_defaults(run=_dashboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except tuple(START_UP_ERRORS) as exc:
        label = next(text for kind, text in START_UP_ERRORS.items() if isinstance(exc, kind))
        print(f"loopwarden: {label}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
