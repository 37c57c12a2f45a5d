"""The local Kafka broker works with both Python clients the project uses.

kafka-python is what tooling and tests use; aiokafka is what Faust runs on.
Kafka 4 dropped old protocol versions, so each client is checked for the
calls the project makes: create topics, produce, consume, commit offsets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaTimeoutError, RebalanceInProgressError

from streams.kafka import clients as kafka_clients
from streams.tools.broker import BrokerError, LocalBroker, is_reachable

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    with kafka_clients.admin(bootstrap) as admin:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}})
        admin.wait_for_topics([topic])


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = kafka_clients.producer(bootstrap, acks="all")
    try:
        for i, value in enumerate(values):
            producer.send(topic, key=b"k%d" % i, value=value).get(timeout=10)
    finally:
        producer.close()


def _consume_and_commit(bootstrap: str, topic: str, group: str, count: int) -> list[bytes]:
    """`count` records of the topic read in a new group, in offset order per
    partition, then their offsets committed.

    A commit made while the group rebalances is refused
    (RebalanceInProgressError): the member must rejoin first, which its next
    poll does, and may get its partitions back from their committed offsets.
    So the records are kept by offset (one read again is the same record),
    and after a refusal the offsets read are committed again only once a poll
    has returned the member to the group, for the partitions it owns then.
    """
    consumer = kafka_clients.consumer(
        bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: dict[TopicPartition, dict[int, bytes]] = {}
    try:
        # A deadline, not a number of polls: while the group is still being
        # joined a poll can return at once, and on a loaded machine the join
        # can outlast any fixed count of them.
        deadline = time.monotonic() + 60
        # Subscribed only once the client knows the topic's partitions: a
        # group leader that joins before its metadata has them assigns nothing,
        # and notices only at its next metadata refresh (5 minutes); seen
        # right after a broker restart.
        while not consumer.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.1)
        consumer.subscribe([topic])
        committed = False
        while not committed and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                got.setdefault(tp, {}).update((r.offset, r.value) for r in records)
            if sum(map(len, got.values())) < count:
                continue
            owned = consumer.assignment()
            try:
                consumer.commit(
                    {tp: OffsetAndMetadata(max(read) + 1, "", -1) for tp, read in got.items() if tp in owned}
                )
                committed = True
            except RebalanceInProgressError:
                pass  # the next poll rejoins the group
    finally:
        consumer.close()
    return [value for tp in sorted(got) for _, value in sorted(got[tp].items())]


def _committed_total(bootstrap: str, group: str) -> int:
    with kafka_clients.admin(bootstrap) as admin:
        offsets = admin.list_group_offsets({group: None})[group]
    return sum(meta.offset for meta in offsets.values())


def test_broker_is_up_on_loopback(broker: LocalBroker) -> None:
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert broker.pid is not None and broker.running
    assert is_reachable(broker.bootstrap, timeout=5)
    assert broker.log_file.is_file()  # the broker logs to a file, not stdout
    assert not is_reachable("127.0.0.1:1", timeout=0.5)


def test_kafka_python_topic_produce_consume_commit(broker: LocalBroker) -> None:
    topic, group = _name("kp"), _name("kp-group")
    values = [b"v%d" % i for i in range(10)]
    _create_topic(broker.bootstrap, topic, partitions=3)
    with kafka_clients.admin(broker.bootstrap) as admin:
        assert topic in admin.list_topics()
    _produce(broker.bootstrap, topic, values)
    assert sorted(_consume_and_commit(broker.bootstrap, topic, group, 10)) == sorted(values)
    assert _committed_total(broker.bootstrap, group) == 10


def test_aiokafka_topic_produce_consume_commit(broker: LocalBroker) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic, group = _name("aio"), _name("aio-group")
    values = [b"a%d" % i for i in range(10)]

    async def scenario() -> list[bytes]:
        # The one client the factory has no function for: reached with its connection settings.
        admin = AIOKafkaAdminClient(**kafka_clients.connection(broker.bootstrap))
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
            assert topic in await admin.list_topics()
        finally:
            await admin.close()

        producer = kafka_clients.aio_producer(broker.bootstrap, acks="all")
        await producer.start()
        try:
            for i, value in enumerate(values):
                await producer.send_and_wait(topic, value, key=b"k%d" % i)
        finally:
            await producer.stop()

        consumer = kafka_clients.aio_consumer(
            broker.bootstrap,
            topic,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(20):
                while len(got) < len(values):
                    batches = await consumer.getmany(timeout_ms=200)
                    got.extend(r.value for records in batches.values() for r in records)
            await consumer.commit()
            committed = [await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)]
            assert sum(c or 0 for c in committed) == len(values)
        finally:
            await consumer.stop()
        return got

    assert sorted(asyncio.run(scenario())) == sorted(values)
    # The commit made by aiokafka is what kafka-python's admin reads back.
    assert _committed_total(broker.bootstrap, group) == len(values)


def test_kafka_python_reads_what_aiokafka_wrote(broker: LocalBroker) -> None:
    topic = _name("cross")
    _create_topic(broker.bootstrap, topic, partitions=1)

    async def produce() -> None:
        producer = kafka_clients.aio_producer(broker.bootstrap)
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, b"x%d" % i)
        finally:
            await producer.stop()

    asyncio.run(produce())
    assert _consume_and_commit(broker.bootstrap, topic, _name("cross-group"), 3) == [b"x0", b"x1", b"x2"]


def test_topics_are_not_auto_created(broker: LocalBroker) -> None:
    # Producing to an unknown topic must fail, not create it with a default
    # partition count (see streams/tools/kafka/server.properties.template).
    producer = kafka_clients.producer(broker.bootstrap, max_block_ms=1500)
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.send(_name("missing"), b"x").get(timeout=3)
    finally:
        producer.close()


def test_taken_port_fails_fast(broker: LocalBroker, kafka_lib: Path) -> None:
    with pytest.raises(BrokerError, match="already in use"):
        LocalBroker(broker.port, lib_dir=kafka_lib).start()


def test_restart_keeps_data_and_stop_closes_port(kafka_lib: Path, tmp_path: Path) -> None:
    own = LocalBroker(data_dir=tmp_path / "kafka", lib_dir=kafka_lib)
    own.start()
    try:
        port, first_pid = own.port, own.pid
        assert port is not None
        topic, group = _name("restart"), _name("restart-group")
        _create_topic(own.bootstrap, topic, partitions=1)
        _produce(own.bootstrap, topic, [b"before-1", b"before-2"])
        assert _consume_and_commit(own.bootstrap, topic, group, 2) == [b"before-1", b"before-2"]

        own.restart()
        assert own.port == port and own.pid != first_pid
        _produce(own.bootstrap, topic, [b"after"])
        # The committed offset survived: the group only sees the new record.
        assert _consume_and_commit(own.bootstrap, topic, group, 1) == [b"after"]
        assert _committed_total(own.bootstrap, group) == 3
        pid = own.pid
    finally:
        own.stop()
    assert own.pid is None
    assert not _port_open(port)
    assert not os.path.exists(f"/proc/{pid}")
    assert (tmp_path / "kafka" / "kraft" / "meta.properties").is_file()  # given dir kept


def test_cli_start_status_stop_across_processes(kafka_lib: Path, tmp_path: Path) -> None:
    data = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streams.cli", "broker", *args, "--data-dir", str(data)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            timeout=90,
        )

    started = cli("start")
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip()
    try:
        assert bootstrap.startswith("127.0.0.1:")
        pid = int((data / "broker.pid").read_text())
        assert (data / "bootstrap").read_text().strip() == bootstrap
        status = cli("status")
        assert status.returncode == 0 and status.stdout.strip() == f"node 1 pid {pid} {bootstrap} up"
        assert cli("start").returncode == 2  # one broker per data dir
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not is_reachable(bootstrap, timeout=1)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text()
    down = cli("status")
    assert down.returncode == 1 and down.stdout.strip() == f"node 1 pid - {bootstrap} down"
