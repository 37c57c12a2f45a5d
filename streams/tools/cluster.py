"""A local Kafka cluster: several KRaft nodes on this machine, each its own JVM.

Why: a fleet runs Kafka replicated, and what it meets is a broker dying
while it leads partitions. Tests and benchmarks need that to happen here, on
real brokers: ``LocalCluster`` starts the nodes, SIGKILLs one, brings it back
and tells which node leads a partition; ``loopwarden broker start --nodes 3``
does the same across processes.

Every node is a ``LocalBroker`` (streams/tools/broker.py) playing both roles,
broker and controller, one voter of a static quorum. The data dir holds
``cluster.json`` (the cluster id and each node's two ports, fixed at the
first start, since the voters know each other by them), ``bootstrap`` (all
the nodes, comma-separated) and one ``node-N`` dir per node, laid out as a
single broker's.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import msgspec

from streams.kafka import clients as kafka_clients
from streams.tools.broker import (
    BOOTSTRAP_FILE,
    BrokerError,
    LocalBroker,
    free_port,
    new_cluster_id,
    node_serves,
    running_pid,
    stop_pids,
)

__all__ = ["LAYOUT_FILE", "ClusterLayout", "LocalCluster", "NodeLayout", "read_layout"]

LAYOUT_FILE = "cluster.json"
#: Heap of each node: three share this machine with the workers.
NODE_HEAP = "384m"


class NodeLayout(msgspec.Struct, frozen=True):
    """One node: its id, client port and controller port."""

    node_id: int
    port: int
    controller_port: int


class ClusterLayout(msgspec.Struct, frozen=True):
    """What a cluster's data dir keeps so that any later process can start,
    stop or query the same nodes on the same ports."""

    cluster_id: str
    nodes: list[NodeLayout]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)


def read_layout(data_dir: Path) -> ClusterLayout | None:
    """The layout of a cluster's data dir; None if the dir holds none (a
    single broker's, or nothing yet); BrokerError naming the file if it is unreadable."""
    path = data_dir / LAYOUT_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=ClusterLayout)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BrokerError(f"{path}: not a cluster layout: {exc}") from None


def _new_layout(nodes: int) -> ClusterLayout:
    ports: list[int] = []
    while len(ports) < 2 * nodes:
        candidate = free_port()
        if candidate not in ports:
            ports.append(candidate)
    return ClusterLayout(
        new_cluster_id(),
        [NodeLayout(node, ports[2 * i], ports[2 * i + 1]) for i, node in enumerate(range(1, nodes + 1))],
    )


class LocalCluster:
    """``nodes`` Kafka nodes on 127.0.0.1, combined broker and controller each.

    ``data_dir=None`` uses a fresh temp dir that ``stop()`` deletes; a given
    one is kept, and a cluster started on it again has the same ports, topics
    and offsets. ``start()`` starts whichever nodes are not running (also
    those a previous process started and that died since), and waits until
    every node serves. ``kill(n)`` SIGKILLs node n (a crash), ``restart(n)``
    starts it again and waits for it. Use as a context manager, or call
    ``start()``/``stop()``.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        nodes: int = 3,
        *,
        lib_dir: Path | None = None,
        heap: str = NODE_HEAP,
        startup_timeout: float = 120.0,
        quick_jit: bool = True,
    ) -> None:
        self._temp = data_dir is None
        self.data_dir = (
            Path(data_dir).resolve() if data_dir else Path(tempfile.mkdtemp(prefix="loopwarden-cluster-")).resolve()
        )
        layout = read_layout(self.data_dir)
        if layout is None:
            if nodes < 2:
                raise BrokerError(f"a cluster has two nodes or more, not {nodes}")
            if (self.data_dir / "kraft").exists():
                raise BrokerError(f"{self.data_dir} holds a single broker, not a cluster: give another --data-dir")
            layout = _new_layout(nodes)
        elif len(layout.nodes) != nodes:
            raise BrokerError(f"{self.data_dir} holds a cluster of {len(layout.nodes)} nodes, not {nodes}")
        self.layout = layout
        quorum = {node.node_id: node.controller_port for node in layout.nodes}
        self.nodes: dict[int, LocalBroker] = {
            node.node_id: LocalBroker(
                node.port,
                self.data_dir / f"node-{node.node_id}",
                lib_dir=lib_dir,
                node_id=node.node_id,
                heap=heap,
                startup_timeout=startup_timeout,
                quick_jit=quick_jit,
                quorum=quorum,
                cluster_id=layout.cluster_id,
            )
            for node in layout.nodes
        }

    @property
    def bootstrap(self) -> str:
        """Every node's ``127.0.0.1:PORT``, comma-separated, for clients' bootstrap_servers."""
        return self.layout.bootstrap

    def node(self, node_id: int) -> LocalBroker:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise BrokerError(f"no node {node_id} in this cluster (nodes {sorted(self.nodes)})") from None

    def pid(self, node_id: int) -> int | None:
        """The pid of node ``node_id``'s JVM, whichever process started it; None when it is down."""
        node = self.node(node_id)
        return node.pid or running_pid(node._dir)

    def serving(self, timeout: float = 3.0) -> list[int]:
        """Ids of the nodes that run and serve metadata (unfenced), each asked on its own port."""
        return [
            node_id
            for node_id, node in self.nodes.items()
            if self.pid(node_id) is not None and node_serves(node.port or 0, node_id, timeout)
        ]

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the nodes that are down and wait until each serves; the nodes
        this call launched are stopped again if any of them fails (BrokerError
        with its log's tail)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / LAYOUT_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(self.layout)) + b"\n")
        (self.data_dir / BOOTSTRAP_FILE).write_text(self.bootstrap + "\n")
        missing = [node for node_id, node in self.nodes.items() if self.pid(node_id) is None]
        launched: list[tuple[LocalBroker, float]] = []
        try:
            for node in missing:
                launched.append((node, node.launch()))
            for node, started in launched:
                node.wait_ready(started)
        except BaseException:
            self._stop_nodes([node for node, _ in launched], 5.0)
            raise
        return self

    def stop(self, timeout: float = 20.0, *, remove_data: bool | None = None) -> None:
        """Stop every node, whichever process started it, all at once
        (SIGTERM, SIGKILL after ``timeout`` s); ``remove_data`` defaults to
        True only for a temp dir."""
        stop_pids([pid for node_id in self.nodes if (pid := self.pid(node_id)) is not None], timeout)
        self._stop_nodes(list(self.nodes.values()), timeout)
        if self._temp if remove_data is None else remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id``: a crash, its data left as it was."""
        self.node(node_id).stop(kill=True, remove_data=False)

    def restart(self, node_id: int, *, kill: bool = False) -> LocalBroker:
        """Stop node ``node_id`` if it runs (``kill``: SIGKILL), start it again
        on its ports and data, and wait until it serves."""
        node = self.node(node_id)
        node.stop(kill=kill, remove_data=False)
        return node.start()

    def detach(self) -> None:
        """Leave the nodes running after this process exits; ``loopwarden
        broker stop --data-dir DIR`` stops them later."""
        for node in self.nodes.values():
            if node.running:
                node.detach()

    @staticmethod
    def _stop_nodes(nodes: list[LocalBroker], timeout: float) -> None:
        """Stop the nodes this process launched, all at once; remove every pid file."""
        stop_pids([pid for node in nodes if (pid := node.pid) is not None], timeout)
        for node in nodes:
            node.stop(timeout, remove_data=False)  # reaps the JVM, removes its pid file

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster(bootstrap={self.bootstrap!r}, data_dir={str(self.data_dir)!r})"

    # -- partitions ----------------------------------------------------------

    def leaders(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """Node id leading each partition of ``topic`` (-1 while none does),
        asked of whichever node answers; BrokerError if no node shows the
        topic within ``timeout`` (a topic just created reaches each node on
        its own time)."""
        admin = kafka_clients.admin(
            self.bootstrap,
            client_id="loopwarden-cluster",
            request_timeout_ms=int(timeout * 1000),
            bootstrap_timeout_ms=int(timeout * 1000),
        )
        deadline = time.monotonic() + timeout
        try:
            while True:
                (described,) = admin.describe_topics([topic])
                if described.get("error_code", 0) == 0 and described.get("partitions"):
                    return {part["partition_index"]: part["leader_id"] for part in described["partitions"]}
                if time.monotonic() >= deadline:
                    raise BrokerError(f"topic {topic} is not on the cluster at {self.bootstrap}")
                time.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):
                admin.close()

    def leader(self, topic: str, partition: int) -> int:
        """Node id leading one partition of ``topic``."""
        return self.leaders(topic)[partition]


# --------------------------------------------------------------------------
# Command line (``loopwarden broker start|stop|status`` on a cluster's data dir)
# --------------------------------------------------------------------------


def start_command(data_dir: Path, nodes: int | None, timeout: float | None, heap: str | None, quick_jit: bool) -> int:
    """Start the nodes that are down (all, the first time), leave them
    running, print the bootstrap list last."""
    layout = read_layout(data_dir)
    count = nodes or (len(layout.nodes) if layout else 1)
    cluster = LocalCluster(
        data_dir, count, heap=heap or NODE_HEAP, startup_timeout=timeout or 120.0, quick_jit=quick_jit
    )
    down = [node_id for node_id in cluster.nodes if cluster.pid(node_id) is None]
    cluster.start()
    cluster.detach()
    if down and len(down) < len(cluster.nodes):
        print(f"started node{'s' if len(down) > 1 else ''} {', '.join(map(str, down))}", file=sys.stderr)
    elif not down:
        print(f"all {len(cluster.nodes)} nodes already run", file=sys.stderr)
    print(cluster.bootstrap)
    return 0


def stop_command(data_dir: Path, timeout: float, remove: bool) -> int:
    """Stop every node of the cluster, whichever process started it."""
    layout = read_layout(data_dir)
    assert layout is not None
    LocalCluster(data_dir, len(layout.nodes)).stop(timeout, remove_data=remove)
    return 0


def status_command(data_dir: Path) -> int:
    """One line per node, ``node N pid P HOST:PORT up|down`` (P is ``-`` when
    no JVM runs); exit 1 unless every node serves."""
    layout = read_layout(data_dir)
    assert layout is not None
    cluster = LocalCluster(data_dir, len(layout.nodes))
    serving = set(cluster.serving())
    for node_id, node in cluster.nodes.items():
        pid = cluster.pid(node_id)
        print(f"node {node_id} pid {pid or '-'} {node.bootstrap} {'up' if node_id in serving else 'down'}")
    return 0 if len(serving) == len(cluster.nodes) else 1
