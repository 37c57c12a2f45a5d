"""Fault injection against the real broker and real `loopwarden worker`
subprocesses.

Every test checks the same invariant, not just that the worker kept running:
the verdicts on the decision topic, deduplicated by (run_id, seq), are per
run and in order exactly what `loopwarden replay` writes for the same trace,
and any repeat of a (run_id, seq) is a byte-identical copy of the first.

Each test records its figures (events, verdicts, lost, double-counted,
byte-identical repeats, recovery times) as one JSON line in
``bench/out/reliability.jsonl`` (or $LOOPWARDEN_RELIABILITY_OUT) and prints
them (visible with ``-s``); docs/RELIABILITY.md is built from those lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition

from helpers import REPO, Worker, by_run, make_trace, names, produce, reference, write_config
from streams.kafka import clients as kafka_clients
from streams.tools.broker import LocalBroker
from streams.kafka.topics import Topics
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

FIGURES = Path(os.environ.get("LOOPWARDEN_RELIABILITY_OUT") or REPO / "bench" / "out" / "reliability.jsonl")


# -- figures -----------------------------------------------------------------


def record_figures(test: str, **figures: Any) -> dict[str, Any]:
    """Print one test's figures and append them as a JSON line."""
    line = {"test": test, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **figures}
    print(f"\nRELIABILITY {json.dumps(line)}")
    try:
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        with FIGURES.open("a") as out:
            out.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a read-only checkout still runs the tests
    return line


def check_invariant(published: Sequence[bytes], expected: Sequence[bytes]) -> dict[str, int]:
    """Compare the decision topic with replay; return the figures and assert
    nothing was lost, changed, invented or repeated with different bytes.

    * lost: a (run_id, seq) replay gives that the topic does not have;
    * double_counted: a (run_id, seq) whose verdict differs from replay's (an
      event applied twice, or a state lost, changes a run's counts from there
      on), plus repeats that are not byte-identical, plus verdicts replay
      does not give at all;
    * repeats: byte-identical re-publications (allowed: at-least-once).
    """
    want: dict[tuple[str, int], bytes] = {}
    for line in expected:
        v = json.loads(line)
        want[(v["run_id"], v["seq"])] = line
    first: dict[tuple[str, int], bytes] = {}
    conflicting = repeats = 0
    for line in published:
        v = json.loads(line)
        ident = (v["run_id"], v["seq"])
        if ident in first:
            repeats += 1
            conflicting += first[ident] != line
        else:
            first[ident] = line
    lost = sum(1 for ident in want if ident not in first)
    differ = sum(1 for ident, line in want.items() if ident in first and first[ident] != line)
    extra = sum(1 for ident in first if ident not in want)
    figures = {
        "verdicts_expected": len(want),
        "verdicts_published": len(published),
        "lost": lost,
        "double_counted": differ + conflicting + extra,
        "repeats_identical": repeats - conflicting,
    }
    assert lost == 0 and differ == 0 and conflicting == 0 and extra == 0, figures
    # Per run and in order (first occurrences), exactly replay.
    got_runs, want_runs = by_run(published), by_run(expected)
    assert sorted(got_runs) == sorted(want_runs)
    for run, lines in want_runs.items():
        assert got_runs[run] == lines, f"run {run} differs from replay"
    return figures


# -- Kafka plumbing ----------------------------------------------------------


def create_topics(bootstrap: str, t: dict[str, str], partitions: int) -> None:
    ensure_topics(
        bootstrap,
        Topics(events=t["events"], decisions=t["decisions"], deadletter=t["deadletter"], partitions=partitions),
    )


class Tail:
    """Reads a topic from the beginning in a background thread, keeping each
    record with the monotonic time it arrived. ``pause()``/``resume()`` pause
    the consumer's partitions (it keeps polling, as a paused Kafka consumer
    does). Survives a broker restart (the client reconnects)."""

    def __init__(self, bootstrap: str, topic: str, *, group: str | None = None) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.records: list[tuple[float, Any]] = []
        self.idents: set[tuple[str, int]] = set()
        self.first_seen: dict[tuple[str, int], float] = {}
        self.errors: list[str] = []
        self._want_paused = False
        self.paused = threading.Event()
        self.assigned = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"tail-{topic}")
        self._thread.start()

    def _run(self) -> None:
        consumer = kafka_clients.consumer(
            self.bootstrap,
            group_id=self.group,
            enable_auto_commit=self.group is not None,
            auto_offset_reset="earliest",
            allow_auto_create_topics=False,
            isolation_level="read_committed",
            reconnect_backoff_max_ms=500,
        )
        try:
            partitions = None
            while not partitions and not self._stop.is_set():
                partitions = consumer.partitions_for_topic(self.topic)
                if not partitions:
                    time.sleep(0.1)
            assignment = [TopicPartition(self.topic, p) for p in sorted(partitions or ())]
            if self.group is None:
                consumer.assign(assignment)
                consumer.seek_to_beginning(*assignment)
            else:
                consumer.subscribe([self.topic])
            paused = False
            while not self._stop.is_set():
                if self._want_paused != paused:
                    parts = list(consumer.assignment())
                    if self._want_paused and parts:
                        consumer.pause(*parts)
                        paused = True
                        self.paused.set()
                    elif not self._want_paused:
                        consumer.resume(*consumer.paused())
                        paused = False
                        self.paused.clear()
                try:
                    batch = consumer.poll(timeout_ms=100)
                except Exception as exc:  # broker away: keep trying
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.2)
                    continue
                if consumer.assignment():
                    self.assigned.set()
                now = time.monotonic()
                with self._lock:
                    for part in batch.values():
                        for record in part:
                            self.records.append((now, record))
                            v = json.loads(record.value) if self.topic.endswith("decisions") else None
                            if v is not None:
                                ident = (v["run_id"], v["seq"])
                                if ident not in self.idents:
                                    self.idents.add(ident)
                                    self.first_seen[ident] = now
        finally:
            consumer.close()

    def pause(self) -> None:
        self._want_paused = True

    def resume(self) -> None:
        self._want_paused = False

    def distinct(self) -> int:
        return len(self.idents)

    def values(self) -> list[bytes]:
        with self._lock:
            return [r.value for _, r in self.records]

    def new_since(self, moment: float) -> float | None:
        """When the first (run_id, seq) never seen before ``moment`` arrived."""
        with self._lock:
            later = [t for t in self.first_seen.values() if t >= moment]
        return min(later) if later else None

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str, workers: Sequence[Worker] = ()) -> float:
        """Wait until ``predicate()``; return the monotonic time it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return time.monotonic()
            for w in workers:
                if w.proc is not None and w.proc.poll() is not None:
                    raise AssertionError(
                        f"{w.name} exited ({w.proc.returncode}) waiting for {what}:\n{w.log()[-3000:]}"
                    )
            time.sleep(0.05)
        logs = "\n".join(f"--- {w.name}\n{w.log()[-3000:]}" for w in workers)
        raise AssertionError(f"no {what} after {timeout}s (distinct verdicts {self.distinct()}):\n{logs}")

    def wait_distinct(self, n: int, timeout: float, workers: Sequence[Worker] = ()) -> float:
        return self.wait(lambda: self.distinct() >= n, timeout, f"{n} distinct verdicts", workers)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def produce_paced(bootstrap: str, topic: str, lines: Sequence[bytes], seconds: float, slices: int = 20) -> None:
    """Publish ``lines`` in ``slices`` batches spread over ``seconds``."""
    producer = kafka_clients.producer(bootstrap, acks="all", linger_ms=5, allow_auto_create_topics=False)
    try:
        step = max(1, len(lines) // slices)
        for start in range(0, len(lines), step):
            for line in lines[start : start + step]:
                producer.send(topic, key=json.loads(line)["run_id"].encode(), value=line)
            producer.flush()
            time.sleep(seconds / slices)
    finally:
        producer.close()


def summaries(worker: Worker) -> dict[str, int]:
    """Counters of the worker's last summary line."""
    lines = worker.lines("summary")
    if not lines:
        return {}
    return {k: int(v) for k, v in lines[-1].items() if v.isdigit()}


def incarnation(bootstrap: str, t: dict[str, str], workdir: Path, data: str, n: int, **kwargs: Any) -> Worker:
    """A worker on the data dir of ``data`` with a log of its own (the
    ``n``-th process on that data dir), so counters of one process are never
    read from the log of another."""
    worker = Worker(bootstrap, t, workdir, data, **kwargs)
    worker.name = f"{data}#{n}"
    worker.log_path = workdir / f"{data}-{n}.log"
    return worker


def stop_all(workers: Sequence[Worker]) -> None:
    for w in workers:
        if w.proc is not None and w.proc.poll() is None:
            w.stop(signal.SIGKILL)


def trace(runs: int, per_run: int, seed: int, prefix: str) -> list[bytes]:
    return make_trace(runs=runs, events_per_run=per_run, seed=seed, prefix=prefix)


@dataclass
class Case:
    """One fault test's topics, config, trace, replay's verdicts for it, the
    decision reader and the workers started (stopped at the end)."""

    t: dict[str, str]
    config: Path
    lines: list[bytes]
    expected: list[bytes]
    tail: Tail
    workers: list[Worker] = field(default_factory=list)

    def check(self) -> dict[str, int]:
        return check_invariant(self.tail.values(), self.expected)


@contextlib.contextmanager
def fault_case(
    bootstrap: str,
    tmp_path: Path,
    name: str,
    *,
    runs: int,
    per_run: int,
    seed: int,
    run_prefix: str | None = None,
    partitions: int = 4,
    reader_group: bool = False,
) -> Iterator[Case]:
    """Fresh topics and a trace for one fault; whatever happens, every worker
    still running is killed and the reader closed on the way out."""
    t = names(name)
    config = write_config(tmp_path)
    create_topics(bootstrap, t, partitions)
    lines = trace(runs, per_run, seed, run_prefix or name)
    tail = Tail(bootstrap, t["decisions"], group=f"{t['app_id']}-reader" if reader_group else None)
    case = Case(t, config, lines, reference(lines, config), tail)
    try:
        yield case
    finally:
        stop_all(case.workers)
        tail.close()


# -- (1) SIGKILL mid-trace ----------------------------------------------------


def test_sigkill_mid_trace_and_restart(broker, tmp_path: Path) -> None:
    """The worker is SIGKILLed twice while it is working through a trace
    (at about 25 % and 60 % of the verdicts) and restarted on the same data
    dir each time: nothing lost, nothing counted twice, repeats identical."""
    with fault_case(broker.bootstrap, tmp_path, "kill", runs=64, per_run=40, seed=11) as case:
        kills: list[dict[str, Any]] = []
        started = time.monotonic()
        # Published over ~20 s: a worker takes a few thousand events a second,
        # so a trace published at once would be finished before the first kill.
        feeder = threading.Thread(target=produce_paced, args=(broker.bootstrap, case.t["events"], case.lines, 20.0, 40))
        try:
            feeder.start()
            case.workers.append(incarnation(broker.bootstrap, case.t, tmp_path, "w", 0, config=case.config).start())
            for fraction in (0.25, 0.60):
                case.tail.wait_distinct(int(len(case.expected) * fraction), 120, case.workers[-1:])
                at = case.tail.distinct()
                case.workers[-1].stop(signal.SIGKILL)
                restarted = time.monotonic()
                again = incarnation(broker.bootstrap, case.t, tmp_path, "w", len(case.workers), config=case.config)
                case.workers.append(again.start())
                resumed = case.tail.wait(
                    lambda restarted=restarted: (
                        case.tail.new_since(restarted) is not None or case.tail.distinct() >= len(case.expected)
                    ),
                    120,
                    "first new verdict after restart",
                    case.workers[-1:],
                )
                first_new = case.tail.new_since(restarted)
                kills.append({"killed_at_verdicts": at, "recovery_s": round((first_new or resumed) - restarted, 2)})
            done = case.tail.wait_distinct(len(case.expected), 120, case.workers[-1:])
            time.sleep(1.0)  # stragglers (repeats) still in flight
            assert case.workers[-1].stop() == 0
        finally:
            feeder.join()
    figures = case.check()
    assert all(k["killed_at_verdicts"] < len(case.expected) for k in kills), "each kill happened mid-trace"
    record_figures(
        "sigkill_mid_trace",
        fault="SIGKILL x2 mid-trace, restart same data dir",
        events=len(case.lines),
        **figures,
        kills=kills,
        recovery_s=max(k["recovery_s"] for k in kills),
        total_s=round(done - started, 1),
    )


def test_crash_after_state_written_redelivers_only_duplicates(broker, tmp_path: Path) -> None:
    """The window between the state write and the offset commit, made wide
    on purpose (commit interval 1 h): every event is processed and its state
    written, the worker is SIGKILLed before any offset is committed, and a
    restarted worker gets every event again. Each must be recognised as a
    duplicate (no event counted twice, no verdict published again), and no
    verdict of before the crash is missing."""
    with fault_case(broker.bootstrap, tmp_path, "window", runs=32, per_run=30, seed=12, run_prefix="win") as case:
        extra = ["--commit-interval", "3600s"]
        produce(broker.bootstrap, case.t["events"], case.lines)
        first = incarnation(broker.bootstrap, case.t, tmp_path, "w", 0, config=case.config, extra=extra).start()
        case.workers.append(first)
        case.tail.wait_distinct(len(case.expected), 120, [first])
        first.wait_for(lambda: summaries(first).get("events", 0) >= len(case.lines), 60, "all events processed")
        # The finisher acknowledges a chunk only after its state is written;
        # a chunk count that stops moving means every state is in RocksDB.
        first.wait_for(lambda: summaries(first).get("chunks", 0) > 0, 30, "a finished chunk")
        time.sleep(1.5)
        first.stop(signal.SIGKILL)
        killed = time.monotonic()
        second = incarnation(broker.bootstrap, case.t, tmp_path, "w", 1, config=case.config, extra=extra).start()
        case.workers.append(second)
        second.wait_for(lambda: summaries(second).get("events", 0) >= len(case.lines), 120, "all events redelivered")
        redelivered = summaries(second)
        recovery = time.monotonic() - killed
        time.sleep(1.0)
        assert second.stop() == 0
    figures = case.check()
    assert redelivered.get("duplicates", 0) == redelivered["events"] == len(case.lines), redelivered
    assert redelivered.get("verdicts", 0) == 0, redelivered
    assert figures["verdicts_published"] == len(case.expected), "no verdict published again"
    record_figures(
        "crash_after_state_before_commit",
        fault="SIGKILL after state written, before offset commit",
        events=len(case.lines),
        **figures,
        redelivered=redelivered["events"],
        recognised_duplicates=redelivered["duplicates"],
        recovery_s=round(recovery, 2),
    )


# -- (2) producer retries -----------------------------------------------------


def test_producer_retries_same_seq_twice(broker, tmp_path: Path) -> None:
    """A producer that retries: about a third of the events are sent twice
    in a row, and at the end a fifth of the trace is sent again (a late
    retry of old batches). Same seqs, so each repeat is a duplicate: exactly
    replay's verdicts, each published once."""
    with fault_case(broker.bootstrap, tmp_path, "retry", runs=48, per_run=30, seed=13) as case:
        rng = random.Random(13)
        stream: list[bytes] = []
        for line in case.lines:
            stream.append(line)
            if rng.random() < 0.33:
                stream.append(line)
        late = rng.sample(range(len(case.lines)), len(case.lines) // 5)
        stream += [case.lines[i] for i in sorted(late)]
        assert reference(stream, case.config) == case.expected, "replay itself ignores the repeats"
        started = time.monotonic()
        worker = Worker(broker.bootstrap, case.t, tmp_path, "w", config=case.config).start()
        case.workers.append(worker)
        produce(broker.bootstrap, case.t["events"], stream)
        done = case.tail.wait_distinct(len(case.expected), 120, case.workers)
        worker.wait_for(lambda: summaries(worker).get("events", 0) >= len(stream), 60, "all events processed")
        counts = summaries(worker)
        time.sleep(0.5)
        assert worker.stop() == 0
    figures = case.check()
    assert figures["verdicts_published"] == len(case.expected), "a retried event never gets a second verdict"
    assert counts["duplicates"] >= len(stream) - len(case.lines), counts
    record_figures(
        "producer_retries",
        fault="same events published twice (same seq)",
        events=len(stream),
        events_resent=len(stream) - len(case.lines),
        **figures,
        worker_duplicates=counts["duplicates"],
        total_s=round(done - started, 1),
    )


# -- (4) rebalance: a worker joins, then one leaves ----------------------------


def test_worker_joins_and_leaves_mid_trace(broker, tmp_path: Path) -> None:
    """Worker a runs alone; b joins while events flow (rebalance); then a
    leaves (SIGTERM) while events flow and b takes every partition over."""
    with fault_case(broker.bootstrap, tmp_path, "join", runs=72, per_run=30, seed=14, partitions=6) as case:
        thirds = len(case.lines) // 3
        parts = [case.lines[:thirds], case.lines[thirds : 2 * thirds], case.lines[2 * thirds :]]
        started = time.monotonic()
        a = Worker(broker.bootstrap, case.t, tmp_path, "a", config=case.config, partitions=6).start()
        case.workers.append(a)
        a.wait_assigned(60)
        produce(broker.bootstrap, case.t["events"], parts[0])
        case.tail.wait_distinct(len(reference(parts[0], case.config)) // 3, 120, case.workers)
        b = Worker(broker.bootstrap, case.t, tmp_path, "b", config=case.config, partitions=6)
        joined_at = time.monotonic()
        case.workers.append(b.start())
        feeder = threading.Thread(target=produce_paced, args=(broker.bootstrap, case.t["events"], parts[1], 4.0))
        feeder.start()

        def shared() -> bool:
            la, lb = a.assignments(), b.assignments()
            return bool(la and lb and la[-1] and lb[-1] and not la[-1] & lb[-1] and la[-1] | lb[-1] == set(range(6)))

        balanced = case.tail.wait(shared, 90, "a balanced assignment", case.workers)
        feeder.join()
        feeder = threading.Thread(target=produce_paced, args=(broker.bootstrap, case.t["events"], parts[2], 4.0))
        feeder.start()
        time.sleep(1.0)
        left_at = time.monotonic()
        assert a.stop() == 0  # a leaves the group while events flow
        b_only = case.tail.wait(
            lambda: bool(b.assignments()) and b.assignments()[-1] == set(range(6)), 90, "b owning every partition", [b]
        )
        feeder.join()
        done = case.tail.wait_distinct(len(case.expected), 120, [b])
        time.sleep(1.0)
        assert b.stop() == 0
    figures = case.check()
    per_worker = {w.name: int(w.lines("summary")[-1]["events"]) for w in (a, b)}
    assert all(per_worker.values()), per_worker
    record_figures(
        "rebalance_join_leave",
        fault="2nd worker joins mid-trace, 1st leaves mid-trace",
        events=len(case.lines),
        **figures,
        processed_by=per_worker,
        join_rebalance_s=round(balanced - joined_at, 2),
        leave_rebalance_s=round(b_only - left_at, 2),
        recovery_s=round(max(balanced - joined_at, b_only - left_at), 2),
        total_s=round(done - started, 1),
    )


# -- (5) RocksDB folder deleted -----------------------------------------------


def test_rocksdb_deleted_state_rebuilt_from_changelog(broker, tmp_path: Path) -> None:
    """The worker is stopped, its whole data dir (RocksDB) deleted, and it
    is started again: the run states come back from the changelog, so the
    runs of the first half continue their counts in the second. The
    changelog is zstd-compressed (not the default), so recovery reads
    compressed batches too."""
    zstd = ["--changelog-compression", "zstd"]
    with fault_case(broker.bootstrap, tmp_path, "rocks", runs=48, per_run=40, seed=15) as case:
        half = len(case.lines) // 2
        w = Worker(broker.bootstrap, case.t, tmp_path, "w", config=case.config, extra=zstd).start()
        case.workers.append(w)
        produce(broker.bootstrap, case.t["events"], case.lines[:half])
        case.tail.wait_distinct(len(reference(case.lines[:half], case.config)), 120, case.workers)
        assert w.stop() == 0
        had = sum(1 for p in w.data_dir.rglob("*") if p.is_file())
        assert had > 0, "RocksDB files existed"
        shutil.rmtree(w.data_dir)
        produce(broker.bootstrap, case.t["events"], case.lines[half:])
        restarted = time.monotonic()
        w2 = incarnation(broker.bootstrap, case.t, tmp_path, "w", 1, config=case.config, extra=zstd).start()
        case.workers.append(w2)
        resumed = case.tail.wait(
            lambda: case.tail.new_since(restarted) is not None, 120, "first verdict after restore", [w2]
        )
        done = case.tail.wait_distinct(len(case.expected), 120, [w2])
        time.sleep(0.5)
        assert w2.stop() == 0
    figures = case.check()
    record_figures(
        "rocksdb_deleted",
        fault="data dir deleted while stopped; restore from changelog",
        events=len(case.lines),
        **figures,
        rocksdb_files_deleted=had,
        recovery_s=round(resumed - restarted, 2),
        total_s=round(done - restarted, 1),
    )


# -- (6) broker restart -------------------------------------------------------


@pytest.fixture
def own_broker(kafka_lib: Path):
    """A broker for one test only (it gets restarted)."""
    with LocalBroker(lib_dir=kafka_lib) as running:
        yield running


def test_broker_restart_mid_trace(own_broker: LocalBroker, tmp_path: Path) -> None:
    """The broker is restarted (same port, data kept) while the worker is
    mid-trace; the worker reconnects and the rest of the trace is processed."""
    bootstrap = own_broker.bootstrap
    with fault_case(bootstrap, tmp_path, "bounce", runs=48, per_run=40, seed=16) as case:
        cut = len(case.lines) * 2 // 3
        produce(bootstrap, case.t["events"], case.lines[:cut])
        w = Worker(bootstrap, case.t, tmp_path, "w", config=case.config).start()
        case.workers.append(w)
        case.tail.wait_distinct(len(case.expected) // 4, 120, case.workers)
        at = case.tail.distinct()
        down = time.monotonic()
        own_broker.restart()
        assert own_broker.bootstrap == bootstrap
        up = time.monotonic()
        produce(bootstrap, case.t["events"], case.lines[cut:])
        resumed = case.tail.wait(
            lambda: case.tail.new_since(up) is not None, 120, "first new verdict after the restart", case.workers
        )
        done = case.tail.wait_distinct(len(case.expected), 180, case.workers)
        time.sleep(1.0)
        assert w.proc is not None and w.proc.poll() is None, "the worker survived the broker restart"
        assert w.stop() == 0
    figures = case.check()
    assert at < len(case.expected)
    record_figures(
        "broker_restart",
        fault="broker restarted mid-trace (same port)",
        events=len(case.lines),
        **figures,
        restarted_at_verdicts=at,
        broker_down_s=round(up - down, 2),
        recovery_s=round(resumed - up, 2),
        total_s=round(done - down, 1),
    )


# -- (7) slow consumer --------------------------------------------------------


def test_slow_decision_consumer_paused_then_resumed(broker, tmp_path: Path) -> None:
    """A consumer group reading the decision topic pauses its partitions
    while the worker processes the whole trace, then resumes: the worker is
    not held back, and the consumer gets every verdict, once."""
    with fault_case(broker.bootstrap, tmp_path, "slow", runs=48, per_run=30, seed=17, reader_group=True) as case:
        case.tail.pause()
        w = Worker(broker.bootstrap, case.t, tmp_path, "w", config=case.config).start()
        case.workers.append(w)
        assert case.tail.paused.wait(60), "the reader got its partitions and paused them"
        produce(broker.bootstrap, case.t["events"], case.lines)
        w.wait_for(lambda: summaries(w).get("events", 0) >= len(case.lines), 120, "all events processed while paused")
        held = len(case.tail.records)
        time.sleep(1.0)  # stays paused a little longer
        resumed = time.monotonic()
        case.tail.resume()
        done = case.tail.wait_distinct(len(case.expected), 60, case.workers)
        time.sleep(0.5)
        assert w.stop() == 0
    figures = case.check()
    assert held == 0, "nothing was read while paused"
    assert figures["repeats_identical"] == 0
    record_figures(
        "slow_consumer",
        fault="decision consumer paused until the worker finished, then resumed",
        events=len(case.lines),
        **figures,
        recovery_s=round(done - resumed, 2),
    )


# -- (8) SIGTERM during start-up ----------------------------------------------


def start_on_trace(bootstrap: str, case: Case, tmp_path: Path, extra: list[str]) -> Worker:
    """The case's trace produced, and a first worker (data dir "w") started on it."""
    produce(bootstrap, case.t["events"], case.lines)
    worker = incarnation(bootstrap, case.t, tmp_path, "w", 0, config=case.config, extra=extra).start()
    case.workers.append(worker)
    return worker


def finish_on_restart(bootstrap: str, case: Case, tmp_path: Path) -> None:
    """A second worker on the first one's data dir finishes the trace and stops cleanly."""
    second = incarnation(bootstrap, case.t, tmp_path, "w", 1, config=case.config).start()
    case.workers.append(second)
    # Running before it is stopped: the first worker may have published every
    # verdict already, and a signal during start-up is not a clean stop.
    second.wait_assigned()
    case.tail.wait_distinct(len(case.expected), 60, [second])
    time.sleep(0.5)  # stragglers (repeats) still in flight
    assert second.stop() == 0


#: Moments of start-up, as lines of the worker's log (Faust's and Kafka's
#: loggers at info), at which SIGTERM used to end otherwise than in exit 0.
STARTUP_MOMENTS = {
    # Creating the topics, before Faust handles signals: killed by the signal.
    "topics": "client_id=loopwarden-admin",
    # Declaring the table's changelog topic: InvalidStateError, exit 1.
    "changelog": "Table: runs]: Starting",
}


@pytest.mark.parametrize("moment", sorted(STARTUP_MOMENTS))
def test_sigterm_during_startup_exits_0(broker, tmp_path: Path, moment: str) -> None:
    """SIGTERM (a rolling restart) at a moment of start-up, with events
    waiting: the worker exits 0, and a worker started next on its data dir
    publishes exactly replay's verdicts, so nothing was lost."""
    with fault_case(broker.bootstrap, tmp_path, f"term-{moment}", runs=16, per_run=16, seed=14) as case:
        first = start_on_trace(broker.bootstrap, case, tmp_path, ["--faust-loglevel", "info"])
        marker, deadline = STARTUP_MOMENTS[moment], time.monotonic() + 30
        while marker not in first.log():  # polled often: the changelog moment lasts ~20 ms
            assert first.proc is not None and first.proc.poll() is None, first.log()[-3000:]
            assert time.monotonic() < deadline, f"no {marker!r} in the log:\n{first.log()[-3000:]}"
            time.sleep(0.002)
        code = first.stop()
        assert code == 0, f"exit status {code} on SIGTERM at {moment}:\n{first.log()[-3000:]}"
        finish_on_restart(broker.bootstrap, case, tmp_path)
    figures = case.check()
    record_figures(
        f"sigterm_during_startup_{moment}",
        fault=f"SIGTERM during start-up ({marker!r} logged), then restart",
        events=len(case.lines),
        **figures,
        exit_code=code,
    )


# -- (9) a stop that outlasts --stop-timeout ----------------------------------


def test_overdue_stop_exits_1_and_loses_nothing(broker, tmp_path: Path) -> None:
    """A stop still running --stop-timeout after SIGTERM ends the process
    (status 1, a stop_overdue line) as a SIGKILL would; a worker started next
    on its data dir publishes exactly replay's verdicts."""
    with fault_case(broker.bootstrap, tmp_path, "overdue", runs=16, per_run=16, seed=15) as case:
        first = start_on_trace(broker.bootstrap, case, tmp_path, ["--stop-timeout", "1ms"])
        case.tail.wait_distinct(len(case.expected) // 4, 60, [first])
        code = first.stop()
        assert code == 1, first.log()[-3000:]
        (overdue,) = first.lines("stop_overdue")
        assert overdue["stop_timeout"] == "0.001"
        finish_on_restart(broker.bootstrap, case, tmp_path)
    figures = case.check()
    record_figures(
        "overdue_stop",
        fault="SIGTERM with --stop-timeout 1ms, then restart",
        events=len(case.lines),
        **figures,
        exit_code=code,
    )
