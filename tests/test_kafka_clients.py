"""Every Kafka client, the worker's, the tools', the benchmarks' and the
tests', is made by streams/kafka_clients.py, so that how clients reach and
authenticate to the brokers is configured in one place."""

from __future__ import annotations

import ast
from pathlib import Path

from streams import kafka_clients

ROOT = Path(__file__).resolve().parents[1]
CLIENT_CLASSES = {
    "KafkaProducer",
    "KafkaConsumer",
    "KafkaAdminClient",
    "AIOKafkaProducer",
    "AIOKafkaConsumer",
    "AIOKafkaAdminClient",
    "App",
}
#: The factory's connection settings, spread into a client it has no function for.
CONNECTIONS = ("kafka_clients.connection", "kafka_clients.faust_connection")


def made_outside_the_factory() -> list[str]:
    found = []
    paths = sorted(path for folder in ("streams", "bench", "tests") for path in (ROOT / folder).rglob("*.py"))
    for path in paths:
        if path == ROOT / "streams" / "kafka_clients.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in CLIENT_CLASSES:
                continue
            # A Faust app (or a client without a factory function) takes its
            # broker settings from the factory.
            if any(kw.arg is None and ast.unparse(kw.value).startswith(CONNECTIONS) for kw in node.keywords):
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    return found


def test_no_kafka_client_is_made_outside_the_factory():
    assert made_outside_the_factory() == []


def test_options_are_the_clients_own_and_the_connection_is_shared():
    assert kafka_clients.connection("h:1") == {"bootstrap_servers": "h:1"}
    assert kafka_clients.faust_connection(" a:1, b:2 ,") == {"broker": "kafka://a:1,kafka://b:2"}
