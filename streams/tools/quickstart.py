"""``loopwarden up``: everything a newcomer needs, in one command.

1. If nothing answers at the bootstrap address (and it is a local address),
   start a local Kafka broker (``streams.tools.broker.LocalBroker``) with its data
   under ``./data/kafka`` (or ``~/.cache/loopwarden/kafka`` when ``./data``
   cannot be written).
2. Create the topics.
3. Run a worker (``loopwarden worker`` as a subprocess, same options).
4. With ``--dashboard PORT``: run the fleet stage (``loopwarden fleet``) and
   the operator page (``loopwarden dashboard`` on 127.0.0.1:PORT, reading
   from the earliest records) beside the worker.
5. With ``--demo [TRACE.jsonl]``: publish the trace (by default the sample
   trace, package data so that an installed wheel has it), print each verdict as it
   arrives, and exit once every verdict ``loopwarden replay`` gives for the
   trace has arrived (with ``--dashboard``, keep running instead, so the
   page shows the demo). Each demo tags its run ids with ``@<stamp>`` so that a
   second demo on the same broker starts fresh runs instead of repeating old
   sequence numbers (which the worker would rightly ignore as duplicates).

With ``--secure`` the broker is the secure one of docs/SECURITY.md (TLS,
SASL/SCRAM, ACLs; started unless it already runs in the broker dir): the
worker and the fleet stage connect as the ``worker`` role, the demo as the
``gateway`` role and the page as the read-only ``auditor`` (it reads the
events topic for a run's timeline), with the settings the broker wrote into its ``secrets/``.

On Ctrl-C or SIGTERM, or when one of them exits, the processes this command
started are stopped, and so is the broker if this command started it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streams import listen

from streams.kafka import clients as kafka_clients
from streams.kafka.clients import KafkaSecurity
from streams.worker.settings import Settings, settings_from_args, worker_argv
from streams.kafka.topics import Topics

#: What `up --demo` publishes when given no trace: examples/sample-trace.jsonl,
#: linked into the package so that the wheel carries it.
SAMPLE_TRACE = Path(__file__).resolve().with_name("sample-trace.jsonl")

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class _Stop(Exception):
    """SIGTERM, turned into an exception so that cleanup runs."""


def _say(text: str) -> None:
    print(f"loopwarden up: {text}", file=sys.stderr, flush=True)


def _shown(path: Path) -> str:
    """A path as `up` says it: from the current directory (`./data/kafka`,
    the default wherever the checkout is) when it lies beneath it."""
    try:
        return f"./{path.relative_to(Path.cwd())}"
    except ValueError:
        return str(path)


def _split(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return host, int(port)


def _broker_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).resolve()
    local = Path("data") / "kafka"
    try:
        local.mkdir(parents=True, exist_ok=True)
        probe = local / ".write-test"
        probe.write_text("")
        probe.unlink()
        return local.resolve()
    except OSError:
        return (Path.home() / ".cache" / "loopwarden" / "kafka").resolve()


def _start_broker(settings: Settings, broker_dir: str | None, secure: bool = False):
    """A LocalBroker on the bootstrap's port when nothing answers there."""
    from streams.tools import secure as roles
    from streams.tools.broker import BrokerError, LocalBroker, is_reachable

    data_dir = _broker_dir(broker_dir)
    admin = roles.admin_security(data_dir) if secure else None
    if is_reachable(settings.bootstrap, 3.0, admin or settings.security):
        _say(f"using the Kafka broker at {settings.bootstrap}")
        return None
    host, port = _split(settings.bootstrap)
    if host not in LOCAL_HOSTS:
        raise BrokerError(f"nothing answers at {settings.bootstrap}, and it is not a local address to start one on")
    kind = "a secure local one (TLS, SASL/SCRAM, ACLs)" if secure else "a local one"
    _say(f"no broker at {settings.bootstrap}: starting {kind} (data in {_shown(data_dir)})")
    broker = LocalBroker(port=port, data_dir=data_dir, secure=secure)
    broker.start()
    _say(f"Kafka is up at {broker.bootstrap} (pid {broker.pid})")
    return broker


def _check_secure_names(settings: Settings) -> None:
    """The local secure broker's ACLs name the default app id and topics:
    others are refused (ValueError) before anything starts."""
    from streams.tools import secure as roles

    defaults, topics = Topics(), settings.topics
    names = (topics.events, topics.decisions, topics.deadletter)
    if settings.app_id != roles.APP_ID or names != (defaults.events, defaults.decisions, defaults.deadletter):
        raise ValueError(
            f"--secure: the local secure broker's ACLs are for app id {roles.APP_ID} and the default topic names"
        )


def _secure_roles(data_dir: Path, settings: Settings) -> tuple[Settings, KafkaSecurity, KafkaSecurity]:
    """For ``--secure``: the worker's settings as the worker role, the demo's
    security as the gateway role and the page's as the auditor, from the broker's secrets."""
    from streams.tools import secure as roles

    worker = settings.with_(security=roles.role_security(data_dir, roles.WORKER))
    return worker, roles.role_security(data_dir, roles.GATEWAY), roles.role_security(data_dir, roles.AUDITOR)


def _tag_trace(lines: list[bytes], stamp: str) -> list[bytes]:
    """Append ``@stamp`` to every run id (lines that are not JSON objects
    with a string run_id are kept as they are)."""
    tagged = []
    for line in lines:
        try:
            document = json.loads(line)
        except ValueError:
            tagged.append(line)
            continue
        if isinstance(document, dict) and isinstance(document.get("run_id"), str):
            document["run_id"] = f"{document['run_id']}@{stamp}"
            tagged.append(json.dumps(document, ensure_ascii=False).encode())
        else:
            tagged.append(line)
    return tagged


def _expected(lines: list[bytes], settings: Settings) -> set[tuple[str, int]]:
    from schemas.configfile import load_config
    from streams.tools.replay import replay

    out = io.BytesIO()
    from schemas.policyfile import load_policy

    replay(lines, load_config(settings.config_path).config, out, io.StringIO(), load_policy(settings.policy_path))
    expected = set()
    for line in out.getvalue().splitlines():
        verdict = json.loads(line)
        expected.add((verdict["run_id"], verdict["seq"]))
    return expected


def _run_demo(
    settings: Settings, trace: str, worker: subprocess.Popen[bytes], timeout: float, security: KafkaSecurity
) -> int:
    from kafka import TopicPartition

    from streams.tools.produce import produce

    try:
        raw = [line.rstrip(b"\r\n") for line in Path(trace).read_bytes().splitlines() if line.strip()]
    except OSError as exc:
        _say(f"cannot read the demo trace: {exc}")
        return 2
    stamp = time.strftime("%H%M%S")
    lines = _tag_trace(raw, stamp)
    expected = _expected(lines, settings)
    consumer = kafka_clients.consumer(
        settings.bootstrap,
        security=security,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        allow_auto_create_topics=False,
    )
    try:
        topic = settings.topics.decisions
        partitions = consumer.partitions_for_topic(topic) or set()
        assignment = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assignment)
        consumer.seek_to_end(*assignment)
        for tp in assignment:
            consumer.position(tp)
        report = produce(lines, settings.bootstrap, settings.topics.events, raw=True, security=security)
        if report.failed:
            _say(f"{report.failed} events were not accepted by Kafka: {report.error}")
            return 1
        _say(
            f"published {report.sent} events of {trace} (run ids tagged @{stamp}); waiting for {len(expected)} verdicts"
        )
        seen: set[tuple[str, int]] = set()
        decisions: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        while not expected <= seen:
            if time.monotonic() >= deadline:
                _say(f"timed out: {len(expected - seen)} of {len(expected)} verdicts did not arrive")
                return 1
            if worker.poll() is not None:
                _say(f"the worker exited ({worker.returncode})")
                return 1
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    try:
                        verdict = json.loads(record.value)
                        ident = (verdict["run_id"], verdict["seq"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    if ident in seen or ident not in expected:
                        continue
                    seen.add(ident)
                    decisions[verdict.get("decision", "?")] += 1
                    sys.stdout.buffer.write(record.value + b"\n")
                    sys.stdout.flush()
        summary = ", ".join(f"{n} {d}" for d, n in sorted(decisions.items()))
        _say(f"all {len(expected)} verdicts arrived: {summary}")
        return 0
    finally:
        consumer.close()


class Children:
    """The processes `up` started, by name: each logs to the terminal, or to
    NAME.log beside the worker's data when a demo prints the verdicts there."""

    def __init__(self, log_dir: Path | None) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[Any] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        out = None
        if self.log_dir is not None:
            path = self.log_dir / f"{name.replace(' ', '-')}.log"
            out = open(path, "ab")
            self._logs.append(out)
            _say(f"starting the {name} (log: {_shown(path)})")
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
        )
        self.running[name] = proc
        return proc

    def wait_any(self) -> int:
        """Until one of them exits; its exit status."""
        while True:
            for name, proc in self.running.items():
                if proc.poll() is not None:
                    if len(self.running) > 1:
                        _say(f"the {name} exited ({proc.returncode})")
                    return proc.returncode
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to each, the page first and the worker last; SIGKILL after 60 s."""
        for name, proc in reversed(self.running.items()):
            if proc.poll() is None:
                _say(f"stopping the {name}")
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for out in self._logs:
            out.close()


def _page_argv(settings: Settings, port: int, page_security: KafkaSecurity) -> tuple[list[str], list[str]]:
    """``loopwarden fleet`` and ``loopwarden dashboard`` options beside this worker."""
    topics = settings.topics
    common = ["--bootstrap", settings.bootstrap, "--decisions-topic", topics.decisions]
    fleet = ["fleet", *common, "--data-dir", str(settings.data_dir.parent / "fleet")]
    if topics.replication_factor is not None:
        fleet += ["--replication-factor", str(topics.replication_factor)]
    fleet += settings.security.argv()
    page = ["dashboard", *common, "--events-topic", topics.events, "--port", str(port), "--from", "earliest"]
    for flag, path in (("--config", settings.config_path), ("--policy", settings.policy_path)):
        if path:
            page += [flag, str(path)]
    return fleet, page + page_security.argv()


def run_up(args: argparse.Namespace) -> int:
    from streams.tools.broker import BrokerError
    from streams.tools.secure import SecureSetupError
    from schemas.configfile import ROLLING_OFF, load_config, rolling_off
    from schemas.policyfile import load_policy
    from streams.tools.secure import private_dir
    from streams.kafka.topics import TopicError, ensure_topics

    settings = settings_from_args(args)
    resolved = load_config(settings.config_path)  # a bad config stops here (exit 2), before any process starts
    load_policy(settings.policy_path)  # and so does a bad policy
    for note in resolved.notes:
        _say(f"config: {note}")
    if rolling_off(resolved.config):
        _say(f"config: {ROLLING_OFF}")
    if args.demo and not Path(args.demo).is_file():
        _say(f"no such demo trace: {args.demo}")
        return 2
    try:
        for number in (args.dashboard, settings.web_port):  # taken ports are named before anything starts
            if number is not None:
                listen.check_free(listen.WEB_HOST, number)
    except listen.CannotListen as exc:
        _say(str(exc))
        return 1
    if args.secure:
        try:
            _check_secure_names(settings)
        except ValueError as exc:
            _say(str(exc))
            return 2

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    broker = None
    children = Children(settings.data_dir.parent if args.demo else None)
    try:
        broker = _start_broker(settings, args.broker_dir, args.secure)
        gateway_security = page_security = settings.security
        if args.secure:
            settings, gateway_security, page_security = _secure_roles(_broker_dir(args.broker_dir), settings)
        for state in ensure_topics(settings.bootstrap, settings.topics, security=settings.security):
            _say(f"topic {state.name}: {state.describe()}{' (created)' if state.created else ''}")
        private_dir(settings.data_dir)
        if not args.demo:
            _say("starting the worker; Ctrl-C stops everything")
        worker = children.start("worker", ["worker", *worker_argv(settings)])
        if args.dashboard is not None:
            fleet, page = _page_argv(settings, args.dashboard, page_security)
            children.start("fleet stage", fleet)
            children.start("dashboard", page)
            _say(f"the dashboard: http://127.0.0.1:{args.dashboard}/")
        if args.demo:
            status = _run_demo(settings, args.demo, worker, args.demo_timeout, gateway_security)
            if status or args.dashboard is None:
                return status
            _say(f"the demo is on http://127.0.0.1:{args.dashboard}/; Ctrl-C stops everything")
        return children.wait_any()
    except (KeyboardInterrupt, _Stop):
        return 0
    except (BrokerError, SecureSetupError, TopicError, ValueError) as exc:
        _say(str(exc))
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt, _Stop):
            children.stop()
        if broker is not None:
            with contextlib.suppress(KeyboardInterrupt, _Stop):
                _say("stopping the broker this command started")
                broker.stop()
        signal.signal(signal.SIGTERM, previous)
