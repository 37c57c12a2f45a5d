"""The OpenClaw plugin's Kafka clients (@platformatic/kafka, Node 24) on the
secure broker: TLS with the broker's CA, SASL/SCRAM as the gateway role, its
own consumer group under the gateway's prefix; and a wrong password refused.
The whole gateway over SASL_SSL is not run here: its Kafka side is this."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

import pytest
from kafka import TopicPartition

from openclaw_gateway import OpenClaw, install
from schemas.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from streams import kafka_clients

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("secure_bus.mjs")


@pytest.fixture(scope="module")
def openclaw() -> OpenClaw:
    return install()


def _settings(broker, password_file: str) -> str:
    folder = broker.data_dir / "secrets"
    return json.dumps(
        {
            "bootstrap": broker.bootstrap,
            "securityProtocol": "SASL_SSL",
            "saslMechanism": "SCRAM-SHA-512",
            "saslUsername": "gateway",
            "saslPasswordFile": password_file,
            "sslCaFile": str(folder / "ca.pem"),
        }
    )


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def _start(openclaw: OpenClaw, settings: str) -> tuple[subprocess.Popen[str], queue.Queue, queue.Queue]:
    proc = subprocess.Popen(
        [openclaw.node, str(SCRIPT), settings],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, out), daemon=True).start()
    threading.Thread(target=_lines, args=(proc.stderr, err), daemon=True).start()
    return proc, out, err


def _until(lines: queue.Queue, match: str, timeout: float = 60.0) -> str:
    while True:
        line = lines.get(timeout=timeout)  # queue.Empty fails the test
        if match in line:
            return line


def test_the_plugin_publishes_and_reads_verdicts_over_sasl_ssl(openclaw: OpenClaw, secure_broker) -> None:
    folder = secure_broker.data_dir / "secrets"
    proc, out, err = _start(openclaw, _settings(secure_broker, str(folder / "gateway.password")))
    try:
        _until(out, "published")
        verdict = b'{"run_id":"secure-bus-run","seq":0,"decision":"allow"}'
        producer = kafka_clients.producer(secure_broker.bootstrap, security=secure_broker.security("worker"))
        try:
            producer.send(DECISIONS_TOPIC, key=b"secure-bus-run", value=verdict).get(timeout=30)
        finally:
            producer.close()
        assert _until(out, "verdict ") == f"verdict {verdict.decode()}"
    finally:
        proc.communicate(timeout=30)
    assert "reading verdicts from loopwarden.decisions" in "\n".join(list(err.queue))
    consumer = kafka_clients.consumer(secure_broker.bootstrap, security=secure_broker.security("admin"))
    try:
        tps = [TopicPartition(EVENTS_TOPIC, p) for p in consumer.partitions_for_topic(EVENTS_TOPIC)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        events = []
        for _ in range(50):
            for records in consumer.poll(timeout_ms=200).values():
                events += [json.loads(r.value) for r in records if r.key == b"secure-bus-run"]
            if events:
                break
    finally:
        consumer.close()
    assert events == [
        {"type": "tool_call", "run_id": "secure-bus-run", "seq": 0, "tool_call_id": "c0", "tool_name": "read"}
    ]


def test_the_plugin_with_a_wrong_password_is_refused(openclaw: OpenClaw, secure_broker, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    proc, out, err = _start(openclaw, _settings(secure_broker, str(wrong)))
    try:
        line = _until(err, "loopwarden: cannot read loopwarden.decisions")
    finally:
        proc.kill()
        proc.wait()
    assert out.empty()
    assert line.endswith(f"{secure_broker.bootstrap}: SASL authentication failed.; retrying in 5s")
