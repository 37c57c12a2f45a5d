"""Test helpers: topics of one's own, and a stand-in for the stream worker.

`EmulatedWorker` reads an events topic, applies the engine exactly as
`streams.tools.replay` does (same `apply_safely`, same codec) and publishes each
verdict keyed by run id, so client and audit tests can run before (or
without) the Faust worker. It can also misbehave on purpose (drop, alter,
duplicate or delay verdicts) to give the audit something to find.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from kafka import KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from schemas.config import FleetConfig
from schemas.state import RunState
from schemas.verdicts import Verdict
from schemas.codec import BadEvent, decode_event, encode_verdict
from streams.kafka import clients as kafka_clients
from streams.engine.entry import apply_safely

from helpers import worker_command


def make_topics(bootstrap: str, partitions: int = 3, prefix: str = "t") -> dict[str, str]:
    """Fresh events/decisions/deadletter topics with unique names."""
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
    names = {
        "events": f"{tag}.events",
        "decisions": f"{tag}.decisions",
        "deadletter": f"{tag}.deadletter",
    }
    admin = kafka_clients.admin(bootstrap, client_id="loopwarden-tests")
    try:
        admin.create_topics([NewTopic(name, partitions, 1) for name in names.values()])
    finally:
        admin.close()
    _wait_for_topics(bootstrap, names.values(), partitions)
    return names


def _wait_for_topics(bootstrap: str, names, partitions: int, timeout: float = 30.0) -> None:
    consumer = kafka_clients.consumer(bootstrap, group_id=None)
    try:
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                found = consumer.partitions_for_topic(name)
                if found and len(found) == partitions:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {name} not visible after {timeout}s")
                time.sleep(0.1)
    finally:
        consumer.close()


Tamper = Callable[[Verdict], list[Verdict]]


class EmulatedWorker:
    """A thread doing what the worker does, with the same engine."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        config: FleetConfig | None = None,
        *,
        tamper: Tamper | None = None,
        delay: float = 0.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.config = config or FleetConfig()
        self.tamper = tamper
        self.delay = delay
        self.states: dict[str, RunState] = {}
        self.processed = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulated-worker", daemon=True)
        self._ready = threading.Event()
        self.paused = threading.Event()  # set: read nothing (a worker that is down)

    def __enter__(self) -> EmulatedWorker:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("emulated worker did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        consumer = kafka_clients.consumer(self.bootstrap, group_id=None, fetch_max_wait_ms=50)
        producer = kafka_clients.producer(self.bootstrap, linger_ms=0, acks="all")
        parts = consumer.partitions_for_topic(self.topics["events"])
        tps = [TopicPartition(self.topics["events"], p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if self.paused.is_set():
                    time.sleep(0.05)
                    continue
                for records in consumer.poll(timeout_ms=100).values():
                    for record in records:
                        self._handle(producer, record.key, record.value)
                producer.flush()
        finally:
            producer.close()
            consumer.close()

    def _handle(self, producer: KafkaProducer, key: bytes | None, value: bytes) -> None:
        try:
            event = decode_event(value)
            outcome = apply_safely(self.states.get(event.run_id), event, self.config)
        except BadEvent as exc:
            self.refused += 1
            producer.send(self.topics["deadletter"], key=key, value=str(exc).encode())
            return
        self.states[event.run_id] = outcome.state
        self.processed += 1
        verdicts = list(outcome.verdicts)
        if self.tamper is not None:
            verdicts = [out for v in verdicts for out in self.tamper(v)]
        if self.delay:
            time.sleep(self.delay)
        for verdict in verdicts:
            producer.send(self.topics["decisions"], key=verdict.run_id.encode(), value=encode_verdict(verdict))


# --------------------------------------------------------------------------
# The real worker, as a subprocess
# --------------------------------------------------------------------------


class RealWorker:
    """`loopwarden worker` on the given topics, in its own process group;
    its output goes to `log_path` (shown when a test fails)."""

    def __init__(self, bootstrap: str, topics: dict[str, str], tmp_path, *extra: str, partitions: int = 3) -> None:
        import os
        from pathlib import Path

        self.app_id = f"lw-test-{uuid.uuid4().hex[:6]}"
        self.log_path = Path(tmp_path) / f"{self.app_id}.log"
        self.args = worker_command(
            bootstrap,
            topics,
            app_id=self.app_id,
            data_dir=Path(tmp_path) / f"{self.app_id}-data",
            partitions=partitions,
            extra=extra,
        )
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.cwd = Path(__file__).resolve().parents[1]
        self.proc = None

    def __enter__(self) -> RealWorker:
        import subprocess

        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        import os
        import signal
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
