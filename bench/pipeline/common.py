"""Shared pieces of the pipeline benchmarks (bench/pipeline/*.py).

Each figure is one command; every command prints a table and writes a JSON
record to bench/out/pipeline-<figure>-<UTC time>.json. Without --bootstrap a
temporary local broker (streams.tools.broker.LocalBroker, optimizing JIT on) is
started and stopped; with --bootstrap an existing one is used, which saves
the broker's start-up CPU between figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PYTHON = sys.executable
_SCRIPT = Path(sys.executable).parent / "loopwarden"
LOOPWARDEN = [str(_SCRIPT)] if _SCRIPT.exists() else [PYTHON, "-m", "streams.cli"]


# -- command line ------------------------------------------------------------


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=doc.strip().splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc
    )
    p.add_argument("--bootstrap", help="a running broker (default: start a temporary one)")
    p.add_argument("--partitions", type=int, default=12, help="events topic partitions (default 12)")
    p.add_argument("--repeat", type=int, default=1, help="repetitions; medians are reported (default 1)")
    p.add_argument("--tag", default="", help="free text stored in the JSON record (e.g. the variant tried)")
    return p


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from streams.tools.broker import LocalBroker

    with LocalBroker(quick_jit=False, heap="1g") as b:
        yield b.bootstrap


def topic_names(prefix: str) -> dict[str, str]:
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return {
        "app_id": tag,
        "events": f"{tag}.events",
        "decisions": f"{tag}.decisions",
        "deadletter": f"{tag}.deadletter",
    }


def create_topics(
    bootstrap: str, names: dict[str, str], partitions: int, decisions_partitions: int | None = None
) -> None:
    """The three topics of `names`; the decisions topic as partitioned as the events topic unless told."""
    from streams.kafka.topics import Topics
    from streams.kafka.topics import ensure_topics

    ensure_topics(
        bootstrap,
        Topics(
            events=names["events"],
            decisions=names["decisions"],
            deadletter=names["deadletter"],
            partitions=partitions,
            decisions_partitions=decisions_partitions,
        ),
    )


def stamp_on_append(bootstrap: str, topics: Sequence[str]) -> None:
    """Have the broker stamp each record of ``topics`` with its append time
    (``message.timestamp.type=LogAppendTime``): a third clock between the
    client that sends and the one that reads, shared by every side measured."""
    from kafka.admin import ConfigResource, ConfigResourceType

    from streams.kafka.topics import admin_client

    admin = admin_client(bootstrap)
    try:
        admin.alter_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, name, configs={"message.timestamp.type": "LogAppendTime"})
                for name in topics
            ]
        )
    finally:
        admin.close()


# -- traces ------------------------------------------------------------------


def fleet_messages(events: int, runs: int | None = None, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """(key, value) of the realistic fleet trace (bench/fleet_trace.py, raw
    hashes), read from bench/out/fleet-raw-<events>-s<seed>.jsonl when that
    file exists (the engine benchmark writes it), generated otherwise."""
    import msgspec

    runs = runs or max(1, events // 40)
    cached = OUT / f"fleet-raw-{events}-s{seed}.jsonl"
    if cached.exists() and runs == max(1, events // 40):
        lines = cached.read_bytes().splitlines()
    else:
        from bench.fleet_trace import generate_lines

        lines = [line.rstrip(b"\n") for line in generate_lines(runs, events, seed=seed)]
    decoder = msgspec.json.Decoder()
    out = []
    for line in lines:
        if line:
            out.append((decoder.decode(line)["run_id"].encode(), line))
    return out


def tool_calls(messages: Sequence[tuple[bytes, bytes]]) -> int:
    return sum(1 for _k, v in messages if v.startswith(b'{"type":"tool_call"'))


# -- Kafka -------------------------------------------------------------------


async def produce_all(bootstrap: str, topic: str, messages: Sequence[tuple[bytes, bytes]]) -> float:
    """Publish keyed messages as fast as aiokafka allows; returns seconds."""
    from streams.kafka import clients as kafka_clients

    producer = kafka_clients.aio_producer(
        bootstrap,
        acks="all",
        linger_ms=20,
        max_batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    started = time.perf_counter()
    try:
        pending = []
        for key, value in messages:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 20000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def collect(
    bootstrap: str, topic: str, count: int, timeout: float, *, idle: float = 60.0, progress: Any = None
) -> list[tuple[int, bytes]]:
    """(timestamp ms, value) of a topic's records from the beginning until
    ``count`` arrived, ``idle`` seconds pass without one, or ``timeout``."""
    from aiokafka import TopicPartition

    from streams.kafka import clients as kafka_clients

    consumer = kafka_clients.aio_consumer(
        bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    got: list[tuple[int, bytes]] = []
    try:
        deadline = time.monotonic() + timeout
        consumer.assign([TopicPartition(topic, p) for p in range(partition_count(bootstrap, topic))])
        last = time.monotonic()
        while len(got) < count and time.monotonic() < deadline and time.monotonic() - last < idle:
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            for records in batch.values():
                got.extend((r.timestamp, r.value) for r in records)
                last = time.monotonic()
            if progress is not None:
                progress(len(got))
    finally:
        await consumer.stop()
    return got


def partition_count(bootstrap: str, topic: str) -> int:
    from streams.kafka.topics import describe_partitions

    return describe_partitions(bootstrap, [topic])[topic]


def span_rate(stamps: Sequence[int], events: int) -> tuple[float, float]:
    """(seconds first->last, events per second) from record timestamps."""
    if len(stamps) < 2:
        return float("nan"), float("nan")
    span = (max(stamps) - min(stamps)) / 1000.0
    return span, events / span if span > 0 else float("nan")


# -- processes ----------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def load_average() -> float:
    return os.getloadavg()[0]


def cpu_set(text: str) -> set[int]:
    """``"1"`` or ``"0,2-3"`` -> {1} or {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus``; threads it starts later inherit it."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


class Proc:
    """A subprocess with its own log file; ``ready(marker)`` waits for a log line."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env.pop("LOOPWARDEN_CONFIG", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, marker: str, timeout: float = 120.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count(marker) >= count:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:3]} exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"no {marker!r} after {timeout}s:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(Exception):
            self._log.close()

    def __enter__(self) -> Proc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker(
    bootstrap: str, names: dict[str, str], workdir: Path, name: str, partitions: int, extra: Sequence[str] = ()
) -> Proc:
    """A real ``loopwarden worker`` with default settings except: no standby
    replicas (one worker has nobody to keep them), no periodic summary."""
    argv = [
        *LOOPWARDEN,
        "worker",
        "--bootstrap",
        bootstrap,
        "--app-id",
        names["app_id"],
        "--events-topic",
        names["events"],
        "--decisions-topic",
        names["decisions"],
        "--deadletter-topic",
        names["deadletter"],
        "--partitions",
        str(partitions),
        "--data-dir",
        str(workdir / f"{name}-data"),
        "--standby-replicas",
        "0",
        "--stats-interval",
        "3600s",
        *extra,
    ]
    return Proc(argv, workdir / f"{name}.log")


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"lw-{prefix}-"))


# -- reporting -----------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def record(figure: str, args: argparse.Namespace, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = OUT / f"pipeline-{figure}-{stamp}.json"
    doc = {
        "figure": figure,
        "utc": stamp,
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items()},
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "load1": load_average()},
        **data,
    }
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(f"\nrecord: {path.relative_to(ROOT)}")
    return path
