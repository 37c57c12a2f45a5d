"""Topics follow the cluster: three replicas and min.insync.replicas=2 on a
three-broker cluster, one replica on a single broker, an explicit factor
winning over both; and a worker on the cluster creates its own topics and its
table's changelog that way, publishes its verdicts and its run states with an
idempotent producer, and answers as `replay` does."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.admin import ConfigResource

from helpers import Worker, by_run, consume, make_trace, names, produce, reference, values, write_config
from streams import kafka_clients
from streams.worker.topics import ensure

pytestmark = pytest.mark.integration


def _replication(bootstrap: str, topic: str) -> tuple[set[int], str | None]:
    """The replica counts of a topic's partitions, and its own min.insync.replicas (None: the broker's default)."""
    with kafka_clients.admin(bootstrap) as admin:
        (described,) = admin.describe_topics([topic])
        configs = admin.describe_configs([ConfigResource("TOPIC", topic)])["topic"][topic]
    setting = configs.get("min.insync.replicas")
    return {len(part["replica_nodes"]) for part in described["partitions"]}, setting and setting["value"]


def _producers(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """The producer ids each partition holding records tracks (DescribeProducers): an
    idempotent producer's batches carry its id, which the leader checks their sequence against."""
    consumer = kafka_clients.consumer(bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(parts)
    finally:
        consumer.close()
    with kafka_clients.admin(bootstrap) as admin:
        states = admin.describe_producers([tp for tp in parts if ends[tp]])
    return {tp.partition: [state.producer_id for state in found.active_producers] for tp, found in states.items()}


def test_topic_creation_follows_the_brokers(broker, cluster) -> None:
    t = names("rf")
    plan = [(t["events"], 2, {}), (t["decisions"], 2, {"retention.ms": "3600000"})]

    states = ensure(cluster.bootstrap, plan, None)
    assert [(s.name, s.partitions, s.created, s.replicas) for s in states] == [
        (t["events"], 2, True, 3),
        (t["decisions"], 2, True, 3),
    ]
    assert states[0].describe() == "2 partitions, 3 replicas"
    for name in (t["events"], t["decisions"]):
        assert _replication(cluster.bootstrap, name) == ({3}, "2")
    assert ensure(cluster.bootstrap, plan, None)[0].created is False  # left as it is

    single = ensure(broker.bootstrap, plan, None)
    assert [(s.created, s.replicas) for s in single] == [(True, 1), (True, 1)]
    assert single[0].describe() == "2 partitions"
    assert _replication(broker.bootstrap, t["events"]) == ({1}, None)

    explicit = ensure(cluster.bootstrap, [(t["deadletter"], 1, {})], 1)
    assert explicit[0].replicas == 1
    assert _replication(cluster.bootstrap, t["deadletter"]) == ({1}, None)


def test_a_worker_on_the_cluster_replicates_its_topics_and_publishes_idempotently(cluster, tmp_path: Path) -> None:
    t = names("rf-worker")
    config = write_config(tmp_path)
    lines = make_trace(runs=6, events_per_run=12, seed=3)
    expected = reference(lines, config)
    with Worker(cluster.bootstrap, t, tmp_path, "w1", config=config, partitions=3) as worker:
        worker.wait_for(lambda: worker.lines("ready"), 120, "ready")
        produce(cluster.bootstrap, t["events"], lines)
        records = consume(cluster.bootstrap, t["decisions"], count=len(expected), timeout=120, settle=1.0)
    assert by_run(values(records)) == by_run(expected)
    assert worker.lines("starting")[0]["replicas"] == "3"
    changelog = f"{t['app_id']}-runs-changelog"
    for topic in (t["events"], t["decisions"], t["deadletter"], changelog):
        assert _replication(cluster.bootstrap, topic) == ({3}, "2"), topic
    # One idempotent producer wrote the verdicts and the run states (whole batches, streams/worker/transport.py).
    written = {topic: _producers(cluster.bootstrap, topic) for topic in (t["decisions"], changelog)}
    assert all(written.values()), written
    ids = {pid for found in written.values() for pids in found.values() for pid in pids}
    assert len(ids) == 1 and min(ids) >= 0, written
    assert all(len(pids) == 1 for found in written.values() for pids in found.values()), written
