"""Which node of a LocalCluster (streams/tools/cluster.py) leads the most
partitions, and how long the cluster takes to give every partition a live
leader again once that node is gone: the failover window, measured.

Shared by bench/fleet_sim.py and the failover test.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any


def busiest_leader(cluster: Any, topics: Sequence[str]) -> int:
    """The node leading the most partitions of ``topics`` together (the lowest id on a tie)."""
    counts: Counter[int] = Counter()
    for topic in topics:
        counts.update(leader for leader in cluster.leaders(topic).values() if leader >= 0)
    return min(counts, key=lambda node: (-counts[node], node))


def wait_leaders(cluster: Any, topics: Sequence[str], *, without: int, timeout: float = 120.0) -> float:
    """Wait until every partition of ``topics`` is led by a node other than
    ``without``; return when that held (time.time()). The metadata is asked
    of the live nodes every 100 ms."""
    deadline = time.monotonic() + timeout
    last: dict[str, dict[int, int]] = {}
    while time.monotonic() < deadline:
        try:
            last = {topic: cluster.leaders(topic, timeout=2.0) for topic in topics}
        except Exception:  # no node answered in time: ask again
            time.sleep(0.1)
            continue
        if all(leader not in (-1, without) for leaders in last.values() for leader in leaders.values()):
            return time.time()
        time.sleep(0.1)
    raise TimeoutError(f"partitions still without a live leader after {timeout}s (node {without} gone): {last}")
