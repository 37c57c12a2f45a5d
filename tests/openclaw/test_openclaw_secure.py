"""The OpenClaw plugin over SASL_SSL on the secure broker (docs/SECURITY.md).

Its Kafka clients (@platformatic/kafka, Node 24) connect as the gateway role
(TLS with the broker's CA, SCRAM, one reply partition read without a
consumer group), publish an event and read a verdict on that partition; the
gateway role may join no group, so none can take another gateway's reply
partition over; with a wrong password they are refused with the broker's
reason. A whole `openclaw agent --local` run over SASL_SSL against a worker
started from `worker.env` is `heavy` (about 40 s): `make test-heavy`."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
from pathlib import Path

import pytest
from kafka.errors import GroupAuthorizationFailedError

from helpers import Worker, env_file, keyed
from openclaw_gateway import OpenClaw, gateway_home
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC
from scripted_model import ScriptedModel
from streams.kafka import clients as kafka_clients
from streams.tools import secure
from test_openclaw import executions, loop_on_exec, loopwarden_config, shown_results

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("secure_bus.mjs")
DEFAULT_NAMES = {
    "app_id": secure.APP_ID,
    "events": EVENTS_TOPIC,
    "decisions": DECISIONS_TOPIC,
    "deadletter": DEADLETTER_TOPIC,
}


def _plugin_security(broker, password_file: Path) -> dict[str, str]:
    return {
        "securityProtocol": "SASL_SSL",
        "saslUsername": "gateway",
        "saslPasswordFile": str(password_file),
        "sslCaFile": str(broker.data_dir / "secrets" / "ca.pem"),
    }


@pytest.mark.heavy
def test_a_looping_run_is_blocked_over_sasl_ssl(openclaw: OpenClaw, secure_broker, tmp_path: Path) -> None:
    folder = secure_broker.data_dir / "secrets"
    config = loopwarden_config(tmp_path, warningThreshold=3, criticalThreshold=5)
    counter = tmp_path / "executions.txt"
    env = env_file(folder / "worker.env")
    with (
        Worker(secure_broker.bootstrap, DEFAULT_NAMES, tmp_path, "worker", config=config, env=env) as worker,
        ScriptedModel(loop_on_exec(counter, stop_when="CRITICAL", after=1)) as model,
    ):
        worker.wait_assigned()
        plugin = {"bootstrap": secure_broker.bootstrap, **_plugin_security(secure_broker, folder / "gateway.password")}
        done = openclaw.run_agent(gateway_home(tmp_path, model.base_url, plugin), "Run the tests until they pass.")
        assert done.returncode == 0, done.stderr[-4000:]
        assert re.search(
            rf"reading verdicts from {DECISIONS_TOPIC} partition \d+ of \d+ at {secure_broker.bootstrap}", done.stderr
        )
    results = shown_results(model)
    assert executions(counter) == 5
    assert results[5].startswith("CRITICAL: exec was called 5 times with identical arguments and identical results")
    assert "WARNING: exec was called 3 times" in results[3]


class Bus:
    """tests/openclaw/secure_bus.mjs: the plugin's Bus with the given settings,
    its stdout and stderr lines queued as they come."""

    def __init__(self, openclaw: OpenClaw, broker, password_file: Path) -> None:
        settings = {"bootstrap": broker.bootstrap, **_plugin_security(broker, password_file)}
        self.proc = subprocess.Popen(
            [openclaw.node, str(SCRIPT), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._lines, args=(stream, into), daemon=True).start()

    @staticmethod
    def _lines(stream, into: queue.Queue[str]) -> None:
        for line in stream:
            into.put(line.rstrip("\n"))

    @staticmethod
    def until(lines: queue.Queue[str], match: str) -> str:
        while match not in (line := lines.get(timeout=60)):  # queue.Empty fails the test
            pass
        return line

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def test_the_plugin_publishes_and_reads_verdicts_over_sasl_ssl(openclaw: OpenClaw, secure_broker) -> None:
    password = secure_broker.data_dir / "secrets" / "gateway.password"
    verdict = b'{"run_id":"secure-bus-run","seq":0,"decision":"allow"}'
    with Bus(openclaw, secure_broker, password) as bus:
        partition = int(Bus.until(bus.out, "published").split()[1])  # after the reader is positioned
        # Another gateway (same role) cannot take the reply partition over through a group:
        # joining any group, the prefix the plugin's groups used to have among them, is refused.
        for group in (f"{secure.GATEWAY_GROUP_PREFIX}openclaw", "loopwarden-openclaw-no-group"):
            with pytest.raises(GroupAuthorizationFailedError):
                _join(secure_broker, group)
        producer = kafka_clients.producer(secure_broker.bootstrap, security=secure_broker.security("worker"))
        try:
            # Where the worker publishes the verdict of an event naming `partition`.
            producer.send(DECISIONS_TOPIC, key=b"secure-bus-run", value=verdict, partition=partition).get(timeout=30)
        finally:
            producer.close()
        assert Bus.until(bus.out, "verdict ") == f"verdict {verdict.decode()}"  # it still gets its verdicts
    events = [
        json.loads(value)
        for value in keyed(
            secure_broker.bootstrap, EVENTS_TOPIC, b"secure-bus-run", security=secure_broker.security("admin")
        )
    ]
    assert events == [
        {
            "type": "tool_call",
            "run_id": "secure-bus-run",
            "seq": 0,
            "tool_call_id": "c0",
            "tool_name": "read",
            "reply_partition": partition,
        }
    ]


def _join(broker, group: str) -> None:
    """Subscribe to the decisions topic as the gateway role, a member of `group`."""
    consumer = kafka_clients.consumer(
        broker.bootstrap, security=broker.security("gateway"), group_id=group, enable_auto_commit=False
    )
    try:
        consumer.subscribe([DECISIONS_TOPIC])
        for _ in range(150):  # a refusal ends it at once
            consumer.poll(timeout_ms=200)
    finally:
        consumer.close()


def test_the_plugin_with_a_wrong_password_is_refused(openclaw: OpenClaw, secure_broker, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    with Bus(openclaw, secure_broker, wrong) as bus:
        line = Bus.until(bus.err, "loopwarden: cannot read loopwarden.decisions")
        assert bus.out.empty()
    assert line.endswith(f"{secure_broker.bootstrap}: SASL authentication failed.; retrying in 5s")
