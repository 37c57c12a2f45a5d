"""Topics follow the cluster: three replicas and min.insync.replicas=2 on a
three-broker cluster, one replica on a single broker, an explicit factor
winning over both; and a worker on the cluster creates its own topics and its
table's changelog that way, and answers as `replay` does."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_a_worker_on_the_cluster_replicates_its_topics_and_its_changelog(cluster, tmp_path: Path) -> None:
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
    for topic in (t["events"], t["decisions"], t["deadletter"], f"{t['app_id']}-runs-changelog"):
        assert _replication(cluster.bootstrap, topic) == ({3}, "2"), topic
