"""The local three-node cluster (streams/tools/cluster.py): from the command
line across processes, and from Python with a node SIGKILLed while it leads."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import TopicPartition

from streams import kafka_clients
from streams.tools.broker import is_reachable
from streams.tools.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
STATUS_LINE = re.compile(r"^node (\d+) pid (\d+|-) (127\.0\.0\.1:\d+) (up|down)$")


def _broker_cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "broker", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        timeout=180,
    )


def _status(data: Path) -> tuple[int, list[tuple[int, int | None, str, str]]]:
    """Exit status and the parsed lines of `broker status`; every line must match the format."""
    done = _broker_cli(data, "status")
    lines = done.stdout.splitlines()
    parsed = [STATUS_LINE.match(line) for line in lines]
    assert lines and all(parsed), done.stdout + done.stderr
    return done.returncode, [
        (int(m[1]), None if m[2] == "-" else int(m[2]), m[3], m[4]) for m in parsed if m is not None
    ]


def _gone(pid: int) -> bool:
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True


def test_cli_starts_three_nodes_restarts_only_the_lost_one_and_stops_them(kafka_lib: Path, tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    started = _broker_cli(data, "start", "--nodes", "3")
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.splitlines()[-1]
    addresses = bootstrap.split(",")
    try:
        assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
        code, nodes = _status(data)
        assert code == 0
        assert [(n, address, state) for n, _, address, state in nodes] == [
            (1, addresses[0], "up"),
            (2, addresses[1], "up"),
            (3, addresses[2], "up"),
        ]
        pids = {n: pid for n, pid, _, _ in nodes}
        assert all(pids.values())

        os.kill(pids[2] or 0, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(pids[2] or 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        code, nodes = _status(data)
        assert code == 1
        assert nodes[1] == (2, None, addresses[1], "down")
        assert [(n, pid, state) for n, pid, _, state in (nodes[0], nodes[2])] == [
            (1, pids[1], "up"),
            (3, pids[3], "up"),
        ]

        again = _broker_cli(data, "start")  # only node 2 is started
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[-1] == bootstrap
        code, nodes = _status(data)
        assert code == 0 and all(state == "up" for *_, state in nodes)
        assert nodes[0][1] == pids[1] and nodes[2][1] == pids[3] and nodes[1][1] not in (None, pids[2])
        pids[2] = nodes[1][1]

        refused = _broker_cli(data, "start", "--nodes", "1")
        assert refused.returncode == 2
        assert refused.stderr.strip() == f"error: {data} holds a cluster of 3 nodes, not 1"
    finally:
        stopped = _broker_cli(data, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert all(_gone(pid or 0) for pid in pids.values())
    assert not any(is_reachable(address, timeout=1) for address in addresses)
    code, nodes = _status(data)
    assert code == 1 and [(pid, state) for _, pid, _, state in nodes] == [(None, "down")] * 3


def test_secure_mode_is_single_node_only(tmp_path: Path) -> None:
    refused = _broker_cli(tmp_path / "secure", "start", "--nodes", "3", "--secure")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: --secure runs a single node only: drop --nodes, or --secure"
    assert not (tmp_path / "secure").exists()


def test_a_killed_leader_is_replaced_and_comes_back(cluster: LocalCluster) -> None:
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    with kafka_clients.admin(cluster.bootstrap) as admin:
        admin.create_topics(
            {topic: {"num_partitions": 3, "replication_factor": 3, "configs": {"min.insync.replicas": "2"}}}
        )
        admin.wait_for_topics([topic])
    assert set(cluster.leaders(topic)) == {0, 1, 2}
    assert set(cluster.leaders(topic).values()) <= set(cluster.nodes)
    victim = cluster.leader(topic, 0)

    producer = kafka_clients.producer(cluster.bootstrap, linger_ms=0)
    try:
        for i in range(5):
            producer.send(topic, key=b"k", value=b"before-%d" % i, partition=0).get(timeout=30)
        cluster.kill(victim)
        assert cluster.pid(victim) is None
        # Two of three replicas in sync still take acks=all writes, once a new leader is elected.
        for i in range(5):
            producer.send(topic, key=b"k", value=b"after-%d" % i, partition=0).get(timeout=60)
    finally:
        producer.close()
    assert cluster.leader(topic, 0) not in (victim, -1)
    assert sorted(cluster.serving()) == sorted(set(cluster.nodes) - {victim})

    cluster.restart(victim)
    assert sorted(cluster.serving()) == sorted(cluster.nodes)
    consumer = kafka_clients.consumer(cluster.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 10 and time.monotonic() < deadline:
            got += [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
    finally:
        consumer.close()
    assert got == [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)]
