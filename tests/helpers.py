"""Helpers for the stream-processor tests: traces that exercise every
detector, the offline reference (`replay`), real `loopwarden worker`
subprocesses, and reading the decision / dead-letter topics."""

from __future__ import annotations

import io
import json
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kafka import TopicPartition
from mode.utils.queues import FlowControlEvent, FlowControlQueue

from builders import cli_environ
from schemas.codec import decode_incident
from schemas.configfile import load_config
from schemas.policyfile import load_policy
from streams.kafka import clients as kafka_clients
from streams.kafka.reader import TopicReader
from streams.tools.replay import replay

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "loopwarden"
LOOPWARDEN = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "streams.cli"]

#: Low thresholds so that short runs reach every detector.
DETECTION_CONFIG: dict[str, Any] = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "historySize": 20,
            "warningThreshold": 3,
            "criticalThreshold": 5,
            "unknownToolThreshold": 4,
            "globalCircuitBreakerThreshold": 7,
            "postCompactionGuard": {"windowSize": 3},
        }
    },
    "agents": {
        "list": [
            {"id": "careful", "tools": {"loopDetection": {"warningThreshold": 2, "criticalThreshold": 4}}},
            # Out of order on purpose: corrected (and logged once) at start-up.
            {"id": "sloppy", "tools": {"loopDetection": {"warningThreshold": 4, "criticalThreshold": 4}}},
        ]
    },
}


def write_config(directory: Path, document: dict[str, Any] | None = None) -> Path:
    path = directory / "loopwarden.json"
    path.write_text(json.dumps(document or DETECTION_CONFIG))
    return path


# -- traces ------------------------------------------------------------------


class _Run:
    """Builds one run's events, numbering seqs and call ids."""

    def __init__(self, run_id: str, agent: str | None) -> None:
        self.run_id = run_id
        self.agent = agent
        self.seq = 0
        self.calls = 0
        self.events: list[dict[str, Any]] = []

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def call(self, tool: str, args: Any, result: Any = None, error: str | None = None) -> None:
        self.calls += 1
        call_id = f"c{self.calls}"
        event = {
            "type": "tool_call",
            "run_id": self.run_id,
            "seq": self._next(),
            "tool_call_id": call_id,
            "tool_name": tool,
            "args": args,
        }
        if self.agent and self.calls == 1:
            event["agent_id"] = self.agent
        self.events.append(event)
        outcome: dict[str, Any] = {
            "type": "tool_result",
            "run_id": self.run_id,
            "seq": self._next(),
            "tool_call_id": call_id,
            "tool_name": tool,
        }
        if error is not None:
            outcome["error"] = error
        else:
            outcome["result"] = {"content": [{"type": "text", "text": str(result)}]}
        self.events.append(outcome)

    def compaction(self) -> None:
        self.events.append({"type": "compaction", "run_id": self.run_id, "seq": self._next()})

    def end(self) -> None:
        self.events.append({"type": "run_end", "run_id": self.run_id, "seq": self._next()})

    def duplicate_last(self) -> None:
        self.events.append(dict(self.events[-1]))


def _script(run: _Run, kind: str, length: int, rng: random.Random) -> None:
    """Fill a run with about ``length`` events of one loop pattern."""
    steps = max(2, length // 2)
    if kind == "healthy":
        for i in range(steps):
            run.call("read", {"path": f"src/file{i}.py"}, f"contents {i}")
    elif kind == "repeat":  # generic_repeat warn/block, then the global breaker
        for _ in range(steps):
            run.call("exec", {"command": "make test"}, {"status": "failed"})
    elif kind == "args_only":  # identical args, changing results: warnings only
        for i in range(steps):
            run.call("search", {"q": "flaky"}, f"page {i}")
    elif kind == "poll":
        for _ in range(steps):
            run.call("process", {"action": "poll", "sessionId": "s1"}, "still running")
    elif kind == "pingpong":
        for i in range(steps):
            run.call("browser", {"url": "a" if i % 2 else "b"}, "same page")
    elif kind == "unknown":
        for _ in range(steps):
            run.call("web_serch", {"q": "x"}, error="Unknown tool: web_serch")
    elif kind == "compaction":
        run.call("exec", {"command": "ls"}, "a b")
        run.compaction()
        for _ in range(max(1, steps - 1)):
            run.call("exec", {"command": "build"}, "error: out of space")
    elif kind == "ended":  # run_end, a redelivered old event, then a fresh history
        half = max(1, steps // 2)
        for _ in range(half):
            run.call("exec", {"command": "make"}, "fail")
        run.end()
        run.events.append(dict(run.events[1]))  # an old seq: a duplicate after run_end
        for _ in range(max(1, steps - half)):
            run.call("exec", {"command": "make"}, "fail")
    if rng.random() < 0.3 and run.events:
        run.duplicate_last()


KINDS = ("healthy", "repeat", "args_only", "poll", "pingpong", "unknown", "compaction", "ended")


def make_trace(runs: int, events_per_run: int = 24, *, seed: int = 7, prefix: str = "run") -> list[bytes]:
    """Interleaved runs, each a loop pattern (all patterns used round robin),
    per-run order kept; one JSON line per event."""
    rng = random.Random(seed)
    queues: list[list[dict[str, Any]]] = []
    for i in range(runs):
        kind = KINDS[i % len(KINDS)]
        agent = "careful" if i % 5 == 3 else "sloppy" if i % 7 == 5 else (f"agent-{i % 3}" if i % 2 else None)
        run = _Run(f"{prefix}-{i:04d}-{kind}", agent)
        _script(run, kind, events_per_run, rng)
        queues.append(run.events)
    lines: list[bytes] = []
    positions = [0] * len(queues)
    live = [i for i, q in enumerate(queues) if q]
    while live:
        i = rng.choice(live)
        lines.append(json.dumps(queues[i][positions[i]], separators=(",", ":")).encode())
        positions[i] += 1
        if positions[i] == len(queues[i]):
            live.remove(i)
    return lines


def reference(lines: Iterable[bytes], config_path: Path | None, policy_path: Path | None = None) -> list[bytes]:
    """What `loopwarden replay` writes for these lines."""
    out = io.BytesIO()
    replay(list(lines), load_config(config_path).config, out, io.StringIO(), load_policy(policy_path))
    return out.getvalue().splitlines()


def by_run(verdicts: Iterable[bytes], *, dedupe: bool = True) -> dict[str, list[bytes]]:
    """Verdict lines grouped per run, in order; repeated (run_id, seq) dropped."""
    runs: dict[str, list[bytes]] = {}
    seen: dict[tuple[str, int], bytes] = {}
    for line in verdicts:
        verdict = json.loads(line)
        ident = (verdict["run_id"], verdict["seq"])
        if dedupe and ident in seen:
            assert seen[ident] == line, f"a redelivered verdict differs: {seen[ident]!r} vs {line!r}"
            continue
        seen[ident] = line
        runs.setdefault(verdict["run_id"], []).append(line)
    return runs


# -- Kafka -------------------------------------------------------------------


def names(prefix: str = "t") -> dict[str, str]:
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return {
        "app_id": tag,
        "events": f"{tag}.events",
        "decisions": f"{tag}.decisions",
        "deadletter": f"{tag}.deadletter",
        "incidents": f"{tag}.incidents",
    }


def produce(
    bootstrap: str,
    topic: str,
    lines: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    security: kafka_clients.KafkaSecurity = kafka_clients.PLAINTEXT,
) -> None:
    producer = kafka_clients.producer(
        bootstrap, security=security, acks="all", linger_ms=5, allow_auto_create_topics=False
    )
    try:
        for i, line in enumerate(lines):
            key = keys[i] if keys is not None else json.loads(line)["run_id"].encode()
            producer.send(topic, key=key, value=line)
        producer.flush()
    finally:
        producer.close()


def consume(
    bootstrap: str,
    topic: str,
    *,
    count: int,
    timeout: float,
    settle: float = 0.0,
    security: kafka_clients.KafkaSecurity = kafka_clients.PLAINTEXT,
) -> list[Any]:
    """Records of a topic from the beginning until ``count`` arrived (then
    ``settle`` more seconds for stragglers), or ``timeout``. A topic not
    created yet is waited for within ``timeout``: a worker or stage under
    load may create it late. One still missing then is a TimeoutError
    naming it, not an empty list."""
    consumer = kafka_clients.consumer(
        bootstrap,
        security=security,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        allow_auto_create_topics=False,
    )
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while not (partitions := consumer.partitions_for_topic(topic)):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {topic!r} has no partitions after {timeout} s: it was never created")
            time.sleep(0.2)
        assignment = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assignment)
        consumer.seek_to_beginning(*assignment)
        settle_until = None
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200)
            for part in batch.values():
                records.extend(part)
            if len(records) >= count and settle_until is None:
                settle_until = time.monotonic() + settle
            if settle_until is not None and time.monotonic() >= settle_until:
                break
    finally:
        consumer.close()
    return records


def keyed(
    bootstrap: str, topic: str, key: bytes, *, security: kafka_clients.KafkaSecurity = kafka_clients.PLAINTEXT
) -> list[bytes]:
    """The values of a topic's records with this key, everything there now,
    read without a group."""
    with TopicReader(bootstrap, "loopwarden-tests", security) as reader:
        tps = reader.partitions(topic)
        return [record.value for record in reader.read(reader.beginnings(tps), reader.ends(tps), key=key)]


def values(records: Iterable[Any]) -> list[bytes]:
    return [r.value for r in records]


def dedupe_key(data: bytes) -> tuple:
    """What makes an incident record unique: one re-published after a restart has the same."""
    incident = decode_incident(data)
    return (incident.tenant, incident.fingerprint, incident.window_start, incident.status, incident.runs)


def incidents_until(
    bootstrap: str,
    topic: str,
    wanted: set[tuple],
    timeout: float,
    *,
    security: kafka_clients.KafkaSecurity = kafka_clients.PLAINTEXT,
) -> list[bytes]:
    """The incident topic's records once every wanted (dedupe) key is there, a second more for stragglers."""
    deadline = time.monotonic() + timeout
    records: list[bytes] = []
    while (left := deadline - time.monotonic()) > 0:
        found = consume(bootstrap, topic, count=len(wanted), timeout=left, settle=1, security=security)
        records = [r.value for r in found]
        if wanted <= {dedupe_key(r) for r in records}:
            break
    return records


def queue_after_resumes(flow: FlowControlEvent, *, suspend_between: bool) -> int:
    """Events left queued after a resume, a put, and a second resume."""
    flow.resume()
    queue: FlowControlQueue[int] = FlowControlQueue(flow_control=flow, clear_on_resume=True)
    queue.put_nowait(1)
    if suspend_between:
        flow.suspend()
    flow.resume()
    return queue.qsize()


# -- workers -----------------------------------------------------------------


def worker_command(
    bootstrap: str,
    topics: dict[str, str],
    *,
    app_id: str,
    data_dir: Path,
    partitions: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a `loopwarden worker` on a test's own topics, app
    id and data dir; no standby replicas, since a test worker has no peer to
    keep them. `extra` options come last, so they override these."""
    return [
        *LOOPWARDEN,
        "worker",
        "--bootstrap",
        bootstrap,
        "--app-id",
        app_id,
        "--events-topic",
        topics["events"],
        "--decisions-topic",
        topics["decisions"],
        "--deadletter-topic",
        topics["deadletter"],
        "--partitions",
        str(partitions),
        "--data-dir",
        str(data_dir),
        "--standby-replicas",
        "0",
        *extra,
    ]


class Worker:
    """A real `loopwarden worker` subprocess with its own data dir and log."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        workdir: Path,
        name: str,
        *,
        config: Path | None,
        partitions: int = 4,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self._place(workdir, name, env)
        self.args = worker_command(
            bootstrap,
            topics,
            app_id=topics["app_id"],
            data_dir=self.data_dir,
            partitions=partitions,
            extra=[
                "--session-timeout",
                "6s",
                "--heartbeat-interval",
                "0.5s",
                "--commit-interval",
                "0.5s",
                "--recovery-delay",
                "0",
                "--stats-interval",
                "1s",
                *(["--config", str(config)] if config else []),
                *extra,
            ],
        )

    def _place(self, workdir: Path, name: str, env: dict[str, str] | None) -> None:
        """Name, log, data dir and extra environment (the same `name` again resumes them)."""
        self.name = name
        self.env = env or {}
        self.log_path = workdir / f"{name}.log"
        self.data_dir = workdir / f"{name}-data"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    def start(self) -> Worker:
        self._log = open(self.log_path, "ab")
        env = cli_environ(**{"PYTHONUNBUFFERED": "1", **self.env})
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO, env=env, stdin=subprocess.DEVNULL
        )
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def lines(self, event: str) -> list[dict[str, str]]:
        """Parsed logfmt lines with ``event=<event>``."""
        found = []
        for line in self.log().splitlines():
            if f" event={event}" in line:
                found.append(parse_logfmt(line))
        return found

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) waiting for {what}:\n{self.log()[-4000:]}"
                )
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: no {what} after {timeout}s:\n{self.log()[-4000:]}")

    def assignments(self) -> list[set[int]]:
        return [
            set() if line.get("partitions") in (None, "none") else {int(p) for p in line["partitions"].split(",")}
            for line in self.lines("assigned")
        ]

    def wait_assigned(self, timeout: float = 60.0, count: int = 1) -> set[int]:
        self.wait_for(lambda: len(self.assignments()) >= count, timeout, "partition assignment")
        return self.assignments()[-1]

    def processed(self) -> int:
        """Events counted in the last summary line."""
        lines = self.lines("summary")
        return int(lines[-1].get("events", 0)) if lines else 0

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


class FleetStage(Worker):
    """A real `loopwarden fleet` subprocess on a test's decision and incident
    topics, with its own app id and data dir (the same `name` again resumes them)."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        workdir: Path,
        name: str,
        *,
        partitions: int = 3,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self._place(workdir, name, env)
        self.args = [
            *LOOPWARDEN,
            "fleet",
            "--bootstrap",
            bootstrap,
            "--app-id",
            f"{topics['app_id']}-{name}",
            "--decisions-topic",
            topics["decisions"],
            "--incidents-topic",
            topics["incidents"],
            "--partitions",
            str(partitions),
            "--data-dir",
            str(self.data_dir),
            "--standby-replicas",
            "0",
            "--session-timeout",
            "6s",
            "--tenant-refresh",  # the tenants other tests left on the shared broker are not this test's
            "0",
            *extra,
        ]


_PAIR = re.compile(r'(\w[\w.]*)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_logfmt(line: str) -> dict[str, str]:
    fields = {}
    for key, value in _PAIR.findall(line):
        fields[key] = json.loads(value) if value.startswith('"') else value
    return fields


def env_file(path: Path) -> dict[str, str]:
    """The variables `set -a; . FILE` exports (read by the shell itself)."""
    shown = subprocess.run(
        ["bash", "-c", 'env -i bash -c \'set -a; . "$0"; env -0\' "$1"', "-", str(path)],
        capture_output=True,
        check=True,
    ).stdout
    pairs = (item.decode().partition("=") for item in shown.split(b"\0") if item)
    return {key: value for key, _, value in pairs if key.startswith("LOOPWARDEN_")}
