"""The options every command that talks to Kafka takes: where the brokers are
(--bootstrap, else $LOOPWARDEN_BOOTSTRAP), how long to wait for them, and the
TLS and SASL settings, checked against the brokers before the command runs."""

from __future__ import annotations

import argparse
import os

from streams.argtypes import duration, format_duration
from streams.kafka.clients import DEFAULT_CONNECT_TIMEOUT, SETTINGS, KafkaSecurity, check_connection, security_from

BOOTSTRAP_ENV = "LOOPWARDEN_BOOTSTRAP"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def default_bootstrap(value: str | None = None) -> str:
    return value or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP


def add_connection_options(
    parser: argparse.ArgumentParser, *, verbose: bool = True, connect_timeout: bool = True
) -> None:
    """--bootstrap, the security flags, --connect-timeout unless the command
    waits for the brokers however long they take (`connect_timeout`), and
    --verbose for a command that does not set up logs of its own (`verbose`)."""
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help=f"Kafka bootstrap servers (default ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )
    add_reach_options(parser, verbose=verbose, connect_timeout=connect_timeout)
    add_security_options(parser)


def add_reach_options(parser: argparse.ArgumentParser, *, verbose: bool = True, connect_timeout: bool = True) -> None:
    """How long a command waits for the brokers, and whether their client's own log lines are shown."""
    if connect_timeout:
        parser.add_argument(
            "--connect-timeout",
            type=duration,
            metavar="DURATION",
            default=DEFAULT_CONNECT_TIMEOUT,
            help="give up when no bootstrap server answers within this long; 0 leaves it to the Kafka client's own "
            f"retries (default {format_duration(DEFAULT_CONNECT_TIMEOUT)})",
        )
    if not verbose:
        return
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the Kafka client's own log lines (connection retries, metadata refreshes)",
    )


def add_security_options(parser: argparse.ArgumentParser) -> None:
    """The TLS and SASL flags (docs/SECURITY.md). Their help names the
    variable, never its value: a default shown by --help could be a secret."""
    group = parser.add_argument_group("Kafka security (a flag wins over its variable)")
    for setting in SETTINGS:
        group.add_argument(
            setting.flag,
            dest=f"kafka_{setting.field}",
            metavar=setting.flag.removeprefix("--").split("-", 1)[1].upper().replace("-", "_"),
            help=f"{setting.help} (default ${setting.env}{', else ' + setting.fallback if setting.fallback else ''})",
        )


def connection_from_args(args: argparse.Namespace) -> tuple[str, KafkaSecurity]:
    """A command's bootstrap and security, checked against the brokers
    (`check_connection`: ConnectionRefused names what was refused,
    KafkaUnreachable the servers that did not answer within --connect-timeout)."""
    bootstrap, security = default_bootstrap(args.bootstrap), security_from_args(args)
    check_connection(bootstrap, security, args.connect_timeout)
    return bootstrap, security


def security_from_args(args: argparse.Namespace) -> KafkaSecurity:
    """The security settings of a command: its flags, else the variables; checked."""
    return security_from({setting.field: getattr(args, f"kafka_{setting.field}", None) for setting in SETTINGS})
