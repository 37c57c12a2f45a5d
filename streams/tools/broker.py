"""A real single-node Apache Kafka broker for local runs and tests.

Why: Faust and its Kafka clients behave differently against a real broker
than against mocks (rebalances, commits, topic creation, restarts), so the
project runs the genuine Kafka JVM. It comes from Maven Central only: the
jars listed in ``kafka/pom.xml`` beside this module are copied into a cache once by
``install()``; nothing else is downloaded at run time.

One JVM plays both KRaft roles (broker and controller) and listens on
127.0.0.1 only. ``LocalBroker`` starts and stops it from Python;
``loopwarden broker start|stop|status|install`` does the same across
processes, keeping a pid file and the bootstrap address in the data dir.
A ``LocalBroker`` can also be one voter of a local cluster
(streams/tools/cluster.py, ``broker start --nodes 3``).

This module uses only the standard library, kafka-python and aiokafka (no Faust), so
any tool or test can use it.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from streams.kafka.clients import PLAINTEXT, KafkaSecurity
from streams.helptext import add_command
from streams.listen import port
from streams.tools import secure

__all__ = [
    "BrokerError",
    "LocalBroker",
    "add_broker_commands",
    "default_home",
    "free_port",
    "install",
    "internal_replication",
    "is_reachable",
    "kafka_version",
    "new_cluster_id",
    "node_serves",
    "run_broker_command",
    "running_pid",
    "stop_pid",
    "stop_pids",
]

# Package data (pyproject.toml), so an installed wheel runs a broker outside the checkout.
KAFKA_DIR = Path(__file__).resolve().with_name("kafka")
POM = KAFKA_DIR / "pom.xml"
TEMPLATE = KAFKA_DIR / "server.properties.template"

HOME_ENV = "LOOPWARDEN_KAFKA_HOME"
MAIN_CLASS = "kafka.Kafka"
# StorageTool lives in the kafka_2.13 jar under this name in 3.x and 4.x.
STORAGE_TOOL = "kafka.tools.StorageTool"

# Names of the files a broker keeps in its data dir.
PID_FILE = "broker.pid"
BOOTSTRAP_FILE = "bootstrap"
SERVER_PROPERTIES = "server.properties"
LOG4J_PROPERTIES = "log4j2.properties"
KRAFT_DIR = "kraft"
LOG_DIR = "logs"
SERVER_LOG = "server.log"
JVM_OUT = "jvm.out"
MARKER = ".installed"

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """Kafka could not be installed, started, reached or stopped."""


# --------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------


def kafka_version() -> str:
    """The Kafka version pinned in streams/tools/kafka/pom.xml (single source)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if not match:
        raise BrokerError(f"no <kafka.version> property in {POM}")
    return match.group(1).strip()


def default_home() -> Path:
    """Cache dir for the jars: $LOOPWARDEN_KAFKA_HOME, else a per-version dir
    under the user's cache, so that two versions never mix their jars."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "loopwarden" / f"kafka-{kafka_version()}"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise BrokerError(f"`{tool}` not found on PATH: {hint}")
    return path


def _java() -> str:
    """$JAVA_HOME/bin/java if set, else `java` on PATH (Kafka 4 needs 17+)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return _require("java", "install a Java 17+ runtime (e.g. openjdk-17-jre-headless)")


def install(cache_dir: Path | None = None) -> Path:
    """Copy the broker's jars from Maven Central into ``cache_dir/lib`` once.

    Returns the ``lib`` dir to put on the classpath. Idempotent: a marker
    holding the pom's digest is written after success, so later calls only
    read it, and editing the pom (a version bump) installs again. A file lock
    makes concurrent callers (parallel test runs, CI) wait for one install.
    """
    home = Path(cache_dir).expanduser() if cache_dir else default_home()
    lib = home / "lib"
    marker = home / MARKER
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    if _installed(marker, lib, digest):
        return lib

    mvn = _require("mvn", "install Apache Maven 3.6+ (e.g. apt-get install maven)")
    _java()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(marker, lib, digest):  # another process finished first
            return lib
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        log.info("installing Kafka %s jars into %s", kafka_version(), lib)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not any(staging.glob("kafka_*.jar")):
            output = (proc.stdout + proc.stderr).strip()[-4000:]
            raise BrokerError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{output}")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        marker.write_text(digest + "\n")
    return lib


def _installed(marker: Path, lib: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest and any(lib.glob("kafka_*.jar"))
    except OSError:
        return False


# --------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------


def _split(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    return host or "127.0.0.1", int(port)


def _port_open(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _serving_brokers(bootstrap: str, timeout: float, security: KafkaSecurity = PLAINTEXT) -> list[int]:
    """Ids of unfenced brokers per a cluster-metadata request; [] on failure.

    An open port alone is not enough: a KRaft broker may accept connections
    before it has caught up with the metadata log and been unfenced.
    """
    from streams.kafka import clients as kafka_clients

    ms = max(int(timeout * 1000), 100)
    admin = None
    try:
        admin = kafka_clients.admin(
            bootstrap,
            security=security,
            client_id="loopwarden-broker-probe",
            request_timeout_ms=ms,
            bootstrap_timeout_ms=ms,
        )
        cluster = admin.describe_cluster()
    except Exception:  # any failure means "not serving yet"
        return []
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()
    return [b["broker_id"] for b in cluster.get("brokers", []) if not b.get("is_fenced")]


def node_serves(port: int, node_id: int, timeout: float) -> bool:
    """Whether the plaintext broker on 127.0.0.1:``port`` itself answers a
    metadata request, listing ``node_id`` among the unfenced brokers. Asked of
    that broker alone: an admin client sends its requests to any broker it
    knows of, and in a cluster with a node just killed that may be the dead one."""
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    async def ask() -> bool:
        conn = await create_conn("127.0.0.1", port, request_timeout_ms=max(int(timeout * 1000), 100))
        try:
            response = await conn.send(MetadataRequest(topics=[]))
        finally:
            conn.close()
        return any(broker[0] == node_id for broker in response.brokers)

    # A thread of its own, so that a caller already running an event loop can ask too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(asyncio.run, asyncio.wait_for(ask(), timeout)).result()
        except Exception:  # any failure means "not serving"
            return False


def is_reachable(bootstrap: str, timeout: float = 5.0, security: KafkaSecurity = PLAINTEXT) -> bool:
    """True if a TCP connect and a cluster-metadata request both succeed and
    the cluster reports at least one serving (unfenced) broker."""
    host, port = _split(bootstrap)
    return _port_open(host, port, timeout) and bool(_serving_brokers(bootstrap, timeout, security))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free right now (it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rpartition(")")[2].split()[0] != "Z"


def _is_our_broker(pid: int, data_dir: Path) -> bool:
    """Guard against a recycled pid: the process must be the JVM running
    kafka.Kafka with this data dir's server.properties."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _alive(pid)  # no /proc: best effort
    wanted = str(data_dir.resolve() / SERVER_PROPERTIES).encode()
    return MAIN_CLASS.encode() in args and wanted in args


def stop_pid(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM ``pid`` (Kafka then shuts down cleanly and flushes its logs),
    SIGKILL it if still alive after ``timeout`` s. True if it had to be killed.
    """
    return bool(stop_pids([pid], timeout))


def stop_pids(pids: Sequence[int], timeout: float = 20.0) -> set[int]:
    """``stop_pid`` for several processes at once: all get SIGTERM together
    (the nodes of a cluster, stopped one after the other, would each wait for
    the quorum the previous ones took away); returns those that had to be killed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while living := [pid for pid in pids if _alive(pid)]:
        if time.monotonic() >= deadline:
            for pid in living:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(living)
        time.sleep(0.05)
    return killed


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"({path} not written)"
    return "\n".join(text.splitlines()[-lines:])


def new_cluster_id() -> str:
    """Kafka's own id format: 16 random bytes, URL-safe base64, no padding
    (Kafka rejects ids it would print with a leading '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def internal_replication(nodes: int) -> tuple[int, int]:
    """Replicas and min ISR of Kafka's internal topics (offsets, transactions)
    on `nodes` nodes: one replica per node up to three, two in sync once
    there are three (docker-compose.cluster.yml says the same)."""
    replicas = min(3, nodes)
    return replicas, min(2, replicas)


_LOG4J_TEMPLATE = """\
# Written by streams/tools/broker.py: the broker logs to a file, never to stdout.
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

# Brokers started by this process and not detached: stopped at interpreter
# exit so that a failing test run does not leave JVMs behind.
_LIVE: set[LocalBroker] = set()


@atexit.register
def _stop_live_brokers() -> None:
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop(timeout=5.0)


class LocalBroker:
    """One Kafka JVM in KRaft mode (broker + controller), on 127.0.0.1.

    ``port=None`` picks a free port at first start; ``data_dir=None`` uses a
    fresh temp dir that ``stop()`` deletes. A given data dir is kept, and a
    broker started again on it keeps its topics and committed offsets.
    ``restart()`` reuses port and data, as a fault test needs. The controller
    listener gets its own free port. Use as a context manager, or call
    ``start()``/``stop()``.

    ``quick_jit`` (default) limits the JVM to its C1 compiler: starting then
    costs about half the CPU (measured: 3.5 s instead of 6-8 s). Loads driven
    by the Python clients don't suffer (150k messages in and out cost the
    broker 2.0-2.9 s of CPU with C1 alone, 2.4-3.5 s with C2 as well), but a
    long broker-bound benchmark may want ``quick_jit=False``.

    ``quorum`` (node id -> controller port, this node's among them) makes
    it one node of a local cluster (streams/tools/cluster.py): the nodes
    share ``cluster_id`` and each keeps its controller port, which the others
    know it by. The internal topics then get up to three replicas.

    ``secure=True`` runs the broker of docs/SECURITY.md: one SASL_SSL
    listener (SCRAM-SHA-512), the StandardAuthorizer and the ACLs of the
    gateway and worker roles, with the CA, the passwords and the clients'
    env files under ``DATA_DIR/secrets`` (streams/tools/secure.py);
    ``security(role)`` gives a client's settings.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: Path | str | None = None,
        *,
        lib_dir: Path | None = None,
        node_id: int = 1,
        heap: str = "512m",
        startup_timeout: float = 60.0,
        quick_jit: bool = True,
        jvm_args: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        secure: bool = False,
        quorum: Mapping[int, int] | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.port = port
        self.quorum = dict(quorum or {})
        if self.quorum and node_id not in self.quorum:
            raise BrokerError(f"node {node_id} is not one of the quorum's voters {sorted(self.quorum)}")
        self.controller_port: int | None = self.quorum.get(node_id)
        self.cluster_id = cluster_id
        self._temp = data_dir is None
        self.data_dir = Path(data_dir).resolve() if data_dir else None
        self.lib_dir = lib_dir
        self.node_id = node_id
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.quick_jit = quick_jit
        self.jvm_args = list(jvm_args)
        self.properties = dict(properties or {})
        self.secure = secure
        self._proc: subprocess.Popen[bytes] | None = None

    # -- public state ------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"`` for clients' bootstrap_servers."""
        if self.port is None:
            raise BrokerError("broker has no port yet: call start() first")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the running JVM, None when stopped."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def security(self, role: str = "admin") -> KafkaSecurity:
        """How a client of `role` (admin, gateway, worker) connects: plaintext
        unless the broker is secure."""
        if not self.secure:
            return PLAINTEXT
        return secure.role_security(self._dir, role)

    @property
    def log_file(self) -> Path:
        """The broker's own log (log4j), for reading after a failure."""
        return self._dir / LOG_DIR / SERVER_LOG

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> LocalBroker:
        """Launch the JVM and block until the broker serves metadata.

        Raises BrokerError (with the tail of the broker log) if the JVM exits
        or is not serving within ``startup_timeout`` seconds.
        """
        started = self.launch()
        self.wait_ready(started)
        return self

    def launch(self) -> float:
        """Start the JVM without waiting for it (the nodes of a cluster wait
        for each other's votes, so all are launched before any is ready);
        returns when, for ``wait_ready``."""
        if self.running:
            raise BrokerError(f"broker already running (pid {self.pid})")
        lib = self.lib_dir or install()
        if self.port is None:
            self.port = free_port()
        elif not _port_free(self.port):
            raise BrokerError(f"port 127.0.0.1:{self.port} is already in use")
        if self.quorum:
            if not _port_free(self.controller_port or 0):
                raise BrokerError(f"controller port 127.0.0.1:{self.controller_port} is already in use")
        else:
            while self.controller_port in (None, self.port) or not _port_free(self.controller_port):
                self.controller_port = free_port()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="loopwarden-kafka-")).resolve()
        data = secure.private_dir(self._dir)
        secure.private_dir(data / LOG_DIR)
        try:
            if self.secure:
                secure.make_secrets(data)
            self._write_configs()
            if not (data / KRAFT_DIR / "meta.properties").exists():
                self._format(lib)
            started = time.monotonic()
            self._launch(lib)
        except BaseException:
            self.stop(timeout=5.0)
            raise
        return started

    def wait_ready(self, started: float) -> None:
        """Block until the launched broker serves metadata; BrokerError (with
        the tail of its log, the JVM stopped) if it exits or is not serving
        within ``startup_timeout`` seconds of ``started``."""
        try:
            self._wait_ready(started)
            if self.secure:
                secure.grant(self._dir, self.bootstrap)
        except BaseException:
            # The error already carries the log tail; a temp dir goes away.
            self.stop(timeout=5.0)
            raise
        log.info("Kafka ready at %s in %.1fs (pid %s)", self.bootstrap, time.monotonic() - started, self.pid)

    def stop(self, timeout: float = 20.0, *, remove_data: bool | None = None, kill: bool = False) -> None:
        """Stop the JVM: SIGTERM, then SIGKILL after ``timeout`` s.

        ``kill=True`` sends SIGKILL at once (a crash, for fault tests).
        ``remove_data`` defaults to True only for a temp data dir.
        """
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is not None and proc.poll() is None:
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
            else:
                stop_pid(proc.pid, timeout)
                proc.wait()
        if self.data_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / PID_FILE).unlink()
            if self._temp if remove_data is None else remove_data:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                if self._temp:
                    self.data_dir = None

    def restart(self, timeout: float = 20.0, *, kill: bool = False) -> LocalBroker:
        """Stop and start again on the same port and data dir (data kept)."""
        self.stop(timeout, remove_data=False, kill=kill)
        return self.start()

    def detach(self) -> int:
        """Leave the JVM running after this process exits (daemon mode);
        ``loopwarden broker stop --data-dir DIR`` stops it later."""
        pid = self.pid
        if pid is None:
            raise BrokerError("broker is not running")
        _LIVE.discard(self)
        self._proc = None
        return pid

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"LocalBroker(bootstrap={self.port and self.bootstrap!r}, pid={self.pid}, data_dir={str(self.data_dir)!r})"
        )

    # -- internals ---------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.data_dir is None:
            raise BrokerError("broker has no data dir yet: call start() first")
        return self.data_dir

    def _java_cmd(self, lib: Path) -> list[str]:
        return [
            _java(),
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            *(["-XX:TieredStopAtLevel=1"] if self.quick_jit else []),
            f"-Dlog4j2.configurationFile={self._dir / LOG4J_PROPERTIES}",
            *self.jvm_args,
            "-cp",
            str(lib / "*"),  # expanded by the JVM
        ]

    def _launch(self, lib: Path) -> None:
        data = self._dir
        with open(data / LOG_DIR / JVM_OUT, "ab") as out:
            self._proc = subprocess.Popen(
                [*self._java_cmd(lib), MAIN_CLASS, str(data / SERVER_PROPERTIES)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=data,
                start_new_session=True,  # Ctrl-C in a terminal goes to us, not the JVM
            )
        _LIVE.add(self)
        (data / PID_FILE).write_text(f"{self._proc.pid}\n")
        (data / BOOTSTRAP_FILE).write_text(self.bootstrap + "\n")

    def _write_configs(self) -> None:
        data = self._dir
        quorum = self.quorum or {self.node_id: self.controller_port}
        replicas, min_isr = internal_replication(len(quorum))
        text = string.Template(TEMPLATE.read_text()).substitute(
            listener="SASL_SSL" if self.secure else "PLAINTEXT",
            node_id=self.node_id,
            port=self.port,
            controller_port=self.controller_port,
            voters=",".join(f"{node}@127.0.0.1:{port}" for node, port in sorted(quorum.items())),
            internal_replicas=replicas,
            internal_min_isr=min_isr,
            log_dir=data / KRAFT_DIR,
        )
        if self.secure:
            text += "\n# The secure broker (streams/tools/secure.py)\n"
            text += "".join(f"{k}={v}\n" for k, v in secure.server_properties(data).items())
        if self.properties:
            text += "\n# Overrides given to LocalBroker(properties=...)\n"
            text += "".join(f"{k}={v}\n" for k, v in self.properties.items())
        if self.secure:  # holds the broker's own password: owner-only
            secure.write_private(data / SERVER_PROPERTIES, text)
        else:
            (data / SERVER_PROPERTIES).write_text(text)
        (data / LOG4J_PROPERTIES).write_text(_LOG4J_TEMPLATE.format(log=data / LOG_DIR / SERVER_LOG))

    def _format(self, lib: Path) -> None:
        """Write meta.properties and the bootstrap metadata (KRaft needs it)."""
        data = self._dir
        with contextlib.ExitStack() as stack:
            users = stack.enter_context(secure.format_arguments(data)) if self.secure else []
            cmd = [
                *self._java_cmd(lib),
                STORAGE_TOOL,
                "format",
                "-t",
                self.cluster_id or new_cluster_id(),
                "-c",
                str(data / SERVER_PROPERTIES),
                *users,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=data)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting {data / KRAFT_DIR} failed ({proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr).strip()[-4000:]}"
            )

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(self._failure(f"Kafka JVM exited with code {code}"))
            serving = _port_open("127.0.0.1", self.port or 0, 0.5) and (
                node_serves(self.port or 0, self.node_id, 2.0)
                if self.quorum
                else self.node_id in _serving_brokers(self.bootstrap, 2.0, self.security())
            )
            if serving:
                return
            if time.monotonic() >= deadline:
                raise BrokerError(
                    self._failure(f"Kafka not serving on {self.bootstrap} after {self.startup_timeout:g}s")
                )
            time.sleep(0.1)

    def _failure(self, what: str) -> str:
        data = self._dir
        return (
            f"{what}\n--- {self.log_file} (tail) ---\n{_tail(self.log_file)}"
            f"\n--- {data / LOG_DIR / JVM_OUT} (tail) ---\n"
            f"{_tail(data / LOG_DIR / JVM_OUT, 15)}"
        )


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _read_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def running_pid(data_dir: Path) -> int | None:
    """The pid of the broker running on ``data_dir`` (from its pid file,
    checked to be that broker's JVM), else None."""
    pid = _read_pid(data_dir)
    if pid is not None and _alive(pid) and _is_our_broker(pid, data_dir):
        return pid
    return None


def _node_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of nodes (1 or more), got {text!r}")
    return int(text)


def add_broker_commands(parser: argparse.ArgumentParser) -> None:
    """``loopwarden broker install|start|stop|status``.

    ``start`` leaves the JVM running in the background and prints its
    bootstrap address; the data dir then holds ``broker.pid`` and
    ``bootstrap`` so that ``stop``/``status`` work from any later process.
    With ``--nodes N`` it starts a local cluster (streams/tools/cluster.py)
    and prints every node's address on its last line.
    """
    sub = parser.add_subparsers(dest="broker_command", required=True, metavar="ACTION")
    p_install = add_command(sub, "install", help="fetch the jars; print the lib dir")
    p_install.add_argument("--cache-dir", type=Path, help="where the jars are kept (default ~/.cache/loopwarden)")
    p_start = add_command(sub, "start", help="start a broker (or a cluster's missing nodes) in the background")
    p_start.add_argument(
        "--data-dir", type=Path, required=True, help="the broker's log and state; stop and status name it again"
    )
    p_start.add_argument(
        "--nodes",
        type=_node_count,
        help="a local cluster of this many nodes, each its own JVM and ports, in DATA_DIR/node-N "
        "(default 1, or the cluster DATA_DIR already holds)",
    )
    p_start.add_argument("--port", type=port, help="default: a free port (a single node only)")
    p_start.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for ready (default 60, 120 for a cluster)"
    )
    p_start.add_argument("--heap", help="JVM -Xmx (default 512m, 384m per node of a cluster)")
    p_start.add_argument(
        "--secure",
        action="store_true",
        help="TLS + SASL/SCRAM listener, ACLs for the gateway and worker roles; "
        "client settings in DATA_DIR/secrets/{gateway,worker}.env (docs/SECURITY.md)",
    )
    p_start.add_argument(
        "--full-jit", action="store_true", help="use the optimizing JIT too: slower start, faster peak (benchmarks)"
    )
    p_stop = add_command(sub, "stop", help="stop the broker (every node of a cluster) of a data dir")
    p_stop.add_argument("--data-dir", type=Path, required=True, help="the data dir the broker was started with")
    p_stop.add_argument("--timeout", type=float, default=20.0, help="seconds before SIGKILL")
    p_stop.add_argument("--remove", action="store_true", help="delete the data dir too")
    p_status = add_command(
        sub,
        "status",
        help="print the bootstrap, or for a cluster one line per node (node N pid P HOST:PORT up|down); "
        "exit 1 if not all serving",
    )
    p_status.add_argument("--data-dir", type=Path, required=True, help="the data dir the broker was started with")


def run_broker_command(args: argparse.Namespace) -> int:
    """Run the action parsed by `add_broker_commands`."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    try:
        if args.broker_command == "install":
            print(install(args.cache_dir))
            return 0
        data_dir = args.data_dir.resolve()
        from streams.tools import cluster

        if args.broker_command == "start" and ((args.nodes or 1) > 1 or cluster.read_layout(data_dir)):
            if args.secure:
                raise BrokerError("--secure runs a single node only: drop --nodes, or --secure")
            if args.port is not None:
                raise BrokerError("--port names a single node's port; a cluster's nodes get free ports")
            return cluster.start_command(data_dir, args.nodes, args.timeout, args.heap, not args.full_jit)
        if cluster.read_layout(data_dir):
            if args.broker_command == "stop":
                return cluster.stop_command(data_dir, args.timeout, args.remove)
            return cluster.status_command(data_dir)
        if args.broker_command == "start":
            if (pid := running_pid(data_dir)) is not None:
                raise BrokerError(f"a broker already runs on {data_dir} (pid {pid})")
            broker = LocalBroker(
                args.port,
                data_dir,
                startup_timeout=args.timeout or 60.0,
                heap=args.heap or "512m",
                quick_jit=not args.full_jit,
                secure=args.secure,
            )
            broker.start()
            broker.detach()
            print(broker.bootstrap)
            return 0
        if args.broker_command == "stop":
            if (pid := running_pid(data_dir)) is not None:
                stop_pid(pid, args.timeout)
            with contextlib.suppress(FileNotFoundError):
                (data_dir / PID_FILE).unlink()
            if args.remove:
                shutil.rmtree(data_dir, ignore_errors=True)
            return 0
        # status: the line a cluster prints for each of its nodes
        if not (data_dir / BOOTSTRAP_FILE).exists():
            print(f"no broker was started on {data_dir}", file=sys.stderr)
            return 1
        bootstrap = (data_dir / BOOTSTRAP_FILE).read_text().strip()
        security = secure.admin_security(data_dir) or PLAINTEXT
        pid = running_pid(data_dir)
        up = pid is not None and is_reachable(bootstrap, 3.0, security)
        print(f"node 1 pid {pid or '-'} {bootstrap} {'up' if up else 'down'}")
        return 0 if up else 1
    except (BrokerError, secure.SecureSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
