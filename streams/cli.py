"""`loopwarden` command line. Each command imports only what it needs, so the
offline commands never pay for the stream stack."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from streams.engine.config import ConfigError


def _replay(args: argparse.Namespace) -> int:
    from streams.configfile import load_config
    from streams.replay import replay

    resolved = load_config(args.config)
    for note in resolved.notes:
        print(f"loopwarden: warning: {note}", file=sys.stderr)
    if args.events == "-":
        return 1 if replay(sys.stdin.buffer, resolved.config, sys.stdout.buffer, sys.stderr) else 0
    try:
        with open(args.events, "rb") as lines:
            refused = replay(lines, resolved.config, sys.stdout.buffer, sys.stderr)
    except OSError as exc:
        print(f"loopwarden: cannot read events: {exc}", file=sys.stderr)
        return 2
    return 1 if refused else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopwarden", description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser("replay", help="recompute verdicts for a JSON-lines event file, offline")
    replay.add_argument("--config", help="gateway config file (JSON/JSON5); default $LOOPWARDEN_CONFIG")
    replay.add_argument("events", help="events file, one JSON object per line, or - for stdin")
    replay.set_defaults(run=_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"loopwarden: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
