"""Hostile input through the real worker, size limits along the whole path
(producer, broker, worker), config safety at start-up, and state bounds at
scale.

Hostile events never stop the worker: each becomes a dead-letter record
(original bytes, reason in headers), and the valid event after it is still
processed. The valid events' verdicts are checked against `replay` with the
same invariant as the fault tests. The million-scale cases run behind
``-m heavy``; the default set runs them at a smaller N.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka.admin import NewTopic
from kafka.errors import KafkaError

from builders import stored
from helpers import LOOPWARDEN, REPO, Worker, consume, make_trace, names, produce, reference, write_config
from schemas.state import RunState
from schemas.codec import decode_event
from schemas.configfile import load_config
from streams.kafka import clients as kafka_clients
from streams.engine import apply
from streams.engine.warnings import MAX_KEYS
from test_faults import Tail, check_invariant, create_topics, record_figures, summaries

MIB = 1024 * 1024
CALL = {"type": "tool_call", "run_id": "bad", "seq": 1, "tool_call_id": "c1", "tool_name": "exec"}


def _event(**fields: Any) -> bytes:
    return json.dumps({**CALL, **fields}, separators=(",", ":")).encode()


def _deep(depth: int, inner: bytes = b"1") -> bytes:
    return (
        b'{"type":"tool_call","run_id":"bad","seq":1,"tool_call_id":"c","tool_name":"t","args":'
        + b"[" * depth
        + inner
        + b"]" * depth
        + b"}"
    )


def hostile_events() -> list[tuple[str, bytes | None, bytes | None, str]]:
    """(what, value, key, expected dead-letter kind)."""
    no_run_id = {k: v for k, v in CALL.items() if k != "run_id"}
    no_type = {k: v for k, v in CALL.items() if k != "type"}
    return [
        ("not JSON", b"this is { not json", b"bad", "not_json"),
        ("truncated JSON", _event()[:-5], b"bad", "not_json"),
        ("JSON array", b"[1, 2, 3]", b"bad", "invalid"),
        ("JSON string", b'"tool_call"', b"bad", "invalid"),
        ("JSON null", b"null", b"bad", "invalid"),
        ("object, wrong field type", _event(tool_name=42), b"bad", "invalid"),
        ("object, fields missing", b'{"type":"tool_call"}', b"bad", "invalid"),
        ("missing run_id", json.dumps(no_run_id).encode(), b"bad", "invalid"),
        ("empty run_id", _event(run_id=""), b"", "invalid"),
        ("null run_id", _event(run_id=None), b"bad", "invalid"),
        ("negative seq", _event(seq=-1), b"bad", "invalid"),
        ("float seq", _event(seq=1.5), b"bad", "invalid"),
        ("string seq", _event(seq="1"), b"bad", "invalid"),
        ("boolean seq", _event(seq=True), b"bad", "invalid"),
        ("seq above 2^63-1", _event(seq=2**63), b"bad", "invalid"),
        ("unknown type", _event(type="tool_cal"), b"bad", "unknown_type"),
        ("missing type", json.dumps(no_type).encode(), b"bad", "missing_type"),
        ("tool_name of 5000 chars", _event(tool_name="t" * 5000), b"bad", "invalid"),
        ("JSON nested 10,000 deep (arrays)", _deep(10_000), b"bad", "not_json"),
        (
            "JSON nested 10,000 deep (objects)",
            b'{"type":"tool_call","run_id":"bad","seq":1,"tool_call_id":"c","tool_name":"t","args":'
            + b'{"a":' * 10_000
            + b"1"
            + b"}" * 10_000
            + b"}",
            b"bad",
            "not_json",
        ),
        ("invalid UTF-8 in a string", _event(tool_name="X").replace(b'"X"', b'"\xff\xfe"'), b"bad", "not_json"),
        ("invalid UTF-8 outside strings", b"\xff\xfe\xfd", b"bad", "not_json"),
        ("invalid UTF-8 inside args", _event(args={"s": "X"}).replace(b'"X"', b'"\xc3\x28"'), b"bad", "not_json"),
        ("empty value", b"", b"bad", "empty"),
        ("null value (tombstone)", None, b"bad", "empty"),
        ("key is not the run_id", _event(run_id="other"), b"bad", "key_mismatch"),
        ("no key", _event(), None, "key_mismatch"),
        ("Kafka key of 1 MB", _event(), b"k" * 1_000_000, "key_mismatch"),
    ]


def valid_specials() -> list[tuple[str, bytes]]:
    """Odd but valid events: processed like any other (a verdict, no dead letter)."""
    return [
        ("JSON object key of 1 MB in args", _event(run_id="big-key", args={"k" * 1_000_000: 1})),
        (
            "args of ~1,000,000 bytes (largest the default path takes)",
            _event(run_id="big-args", args={"blob": "x" * 1_000_000}),
        ),
        ("JSON nested 200 deep (under the 256 limit)", _deep(200).replace(b'"run_id":"bad"', b'"run_id":"deep-ok"')),
        ("float overflow 1e999 in args", _event(run_id="inf", args={"x": 0}).replace(b'"x":0', b'"x":1e999')),
        (
            "lone surrogate escape in args (a string cut through an emoji)",
            _event(run_id="surrogate", args={"s": "cut \ud83d"}),
        ),
    ]


def _create(bootstrap: str, topic: str, partitions: int, configs: dict[str, str]) -> None:
    admin = kafka_clients.admin(bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    finally:
        admin.close()


@pytest.mark.integration
def test_hostile_inputs_through_the_worker(broker, tmp_path: Path) -> None:
    """Every hostile event is dead-lettered with its reason and original
    bytes, the valid event after it is processed, odd-but-valid events get
    their verdicts, the worker never exits, and the threshold order it
    corrected is logged once, at start-up."""
    t = names("hostile")
    config = write_config(tmp_path)
    create_topics(broker.bootstrap, t, 2)
    bad = hostile_events()
    odd = valid_specials()
    valid = make_trace(runs=8, events_per_run=16, seed=21, prefix="ok")
    stream: list[tuple[bytes | None, bytes | None]] = []
    for i, line in enumerate(valid):
        if i < len(bad):
            stream.append(bad[i][1:3])
        if i < len(odd):
            stream.append((odd[i][1], json.loads(odd[i][1])["run_id"].encode()))
        stream.append((line, json.loads(line)["run_id"].encode()))
    good = [value for value, _ in stream if value is not None and value not in {b[1] for b in bad}]
    expected = reference(good, config)
    assert len(expected) >= len(reference(valid, config)) + len(odd)

    tail = Tail(broker.bootstrap, t["decisions"])
    started = time.monotonic()
    try:
        with Worker(broker.bootstrap, t, tmp_path, "w", config=config, partitions=2) as worker:
            producer = kafka_clients.producer(broker.bootstrap, acks="all", max_request_size=4 * MIB)
            try:
                for value, key in stream:
                    producer.send(t["events"], key=key, value=value).get(30)
            finally:
                producer.close()
            done = tail.wait_distinct(len(expected), 120, [worker])
            dead = consume(broker.bootstrap, t["deadletter"], count=len(bad), timeout=60, settle=0.5)
            worker.wait_for(lambda: summaries(worker).get("deadlettered", 0) >= len(bad), 30, "dead letters counted")
            time.sleep(0.5)
            assert worker.proc is not None and worker.proc.poll() is None, "never a crash"
            counts = summaries(worker)
            corrected = worker.lines("config_corrected")
            assert worker.stop() == 0
    finally:
        tail.close()
    figures = check_invariant(tail.values(), expected)
    assert len(dead) == len(bad), [r.value[:60] for r in dead]
    by_value: dict[bytes | None, list[Any]] = {}
    for record in dead:
        by_value.setdefault(record.value, []).append(record)
    kinds: dict[str, str] = {}
    for what, value, key, kind in bad:
        record = by_value[value if value is not None else None].pop(0)
        headers = {k: v.decode() for k, v in record.headers}
        assert record.key == key, what
        assert headers["loopwarden.kind"] == kind, (what, headers)
        assert headers["loopwarden.reason"], what
        kinds[what] = f"{kind}: {headers['loopwarden.reason'][:80]}"
    assert counts["deadlettered"] == len(bad)
    assert len(corrected) == 1 and "agents.list[1].tools.loopDetection.criticalThreshold" in corrected[0]["msg"]
    record_figures(
        "hostile_inputs",
        fault="hostile events interleaved with a valid trace, real worker",
        events=len(stream),
        hostile=len(bad),
        dead_lettered=len(dead),
        odd_valid=len(odd),
        **figures,
        worker_exits=0,
        total_s=round(done - started, 1),
        kinds=kinds,
    )


@pytest.mark.integration
def test_ten_megabyte_event_limits_along_the_path(broker, tmp_path: Path) -> None:
    """10 MB of args: refused by a default producer (1 MB request limit) and,
    with the producer's limit raised, by the broker (message.max.bytes
    1048588, the default the project's broker keeps). On an events topic an
    operator opened to 16 MiB, it reaches the worker, which refuses it (over
    --max-event-bytes, 1 MiB): a 2 MiB event lands in the dead-letter topic;
    10 MB is over the dead-letter limit (4 MiB), so it is logged as
    ``deadletter_failed`` and stays only in the events topic. The next valid
    event is processed either way."""
    ten_mb = _event(run_id="huge", args={"blob": "x" * 10_000_000})
    two_mib = _event(run_id="huge", args={"blob": "x" * (2 * MIB)})
    default_topic = names("limit")["events"]
    _create(broker.bootstrap, default_topic, 1, {})
    refused: dict[str, str] = {}
    small = kafka_clients.producer(broker.bootstrap)
    try:
        with pytest.raises(KafkaError) as exc:
            small.send(default_topic, key=b"huge", value=ten_mb).get(30)
        refused["producer (max_request_size 1 MB)"] = type(exc.value).__name__
    finally:
        small.close()
    big = kafka_clients.producer(broker.bootstrap, max_request_size=16 * MIB, retries=0, enable_idempotence=False)
    try:
        with pytest.raises(KafkaError) as exc:
            big.send(default_topic, key=b"huge", value=ten_mb).get(30)
        refused["broker (message.max.bytes 1048588)"] = type(exc.value).__name__
        largest = _event(run_id="edge", args={"blob": "x" * (MIB - 200)})
        big.send(default_topic, key=b"edge", value=largest).get(30)  # just under the limit: accepted

        t = names("tenmb")
        config = write_config(tmp_path)
        _create(broker.bootstrap, t["events"], 1, {"max.message.bytes": str(16 * MIB)})
        create_topics(broker.bootstrap, t, 1)
        after = make_trace(runs=2, events_per_run=6, seed=22, prefix="after")
        expected = reference([largest, *after], config)
        with Worker(broker.bootstrap, t, tmp_path, "w", config=config, partitions=1) as worker:
            for value, key in [(two_mib, b"huge"), (ten_mb, b"huge"), (largest, b"edge")]:
                big.send(t["events"], key=key, value=value).get(30)
            produce(broker.bootstrap, t["events"], after)
            records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=0.5)
            dead = consume(broker.bootstrap, t["deadletter"], count=1, timeout=30, settle=0.5)
            worker.wait_for(lambda: summaries(worker).get("deadletter_failed", 0) >= 1, 30, "deadletter_failed")
            assert worker.proc is not None and worker.proc.poll() is None, "never a crash"
            counts = summaries(worker)
            failed = worker.lines("deadletter_failed")
            assert worker.stop() == 0
    finally:
        big.close()
    figures = check_invariant([r.value for r in records], expected)
    assert len(dead) == 1 and dead[0].value == two_mib
    assert {k: v.decode() for k, v in dead[0].headers}["loopwarden.kind"] == "too_large"
    # Counted as dead-lettered once the broker has it: the 2 MiB one only.
    assert counts["deadlettered_too_large"] == 1 and counts["deadletter_failed"] == 1, counts
    assert len(failed) == 1
    record_figures(
        "ten_megabyte_event",
        fault="10 MB args; 2 MiB args; ~1 MiB args",
        events=3 + len(after),
        **figures,
        refused_by=refused,
        largest_accepted_bytes=len(largest),
        dead_lettered=1,
        deadletter_failed=1,
    )


def _peak_rss(pid: int) -> int:
    """The process's resident-memory high-water mark (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


@pytest.mark.integration
def test_a_compressed_batch_that_expands_too_far_is_dead_lettered(broker, tmp_path: Path) -> None:
    """64 MiB of zeros, gzip'd by the producer to about 64 KiB, between valid
    events: within the fetch size, but past --max-batch-bytes (2 MiB here)
    once decompressed. The worker dead-letters the batch whole, naming
    topic, partition and offsets, decompressing no more than the bound (its
    peak resident memory grows by less than half the expanded size), and
    the events around it get their verdicts."""
    expanded = 64 * MIB
    t = names("expand")
    config = write_config(tmp_path)
    create_topics(broker.bootstrap, t, 1)
    trace = make_trace(runs=2, events_per_run=12, seed=23, prefix="around")
    before, after = trace[: len(trace) // 2], trace[len(trace) // 2 :]
    expected = reference(trace, config)
    with Worker(
        broker.bootstrap, t, tmp_path, "w", config=config, partitions=1, extra=["--max-batch-bytes", str(2 * MIB)]
    ) as worker:
        produce(broker.bootstrap, t["events"], before)
        consume(broker.bootstrap, t["decisions"], count=len(reference(before, config)), timeout=90)
        assert worker.proc is not None
        peak_before = _peak_rss(worker.proc.pid)
        bomb = kafka_clients.producer(
            broker.bootstrap,
            compression_type="gzip",
            max_request_size=2 * expanded,
            retries=0,
            enable_idempotence=False,
        )
        try:
            sent = bomb.send(t["events"], key=b"bomb", value=bytes(expanded)).get(30)
        finally:
            bomb.close()
        produce(broker.bootstrap, t["events"], after)
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=0.5)
        dead = consume(broker.bootstrap, t["deadletter"], count=1, timeout=30, settle=0.5)
        peak_after = _peak_rss(worker.proc.pid)
        assert worker.proc.poll() is None, "never a crash"
        logged = worker.lines("deadletter")
        assert worker.stop() == 0
    figures = check_invariant([r.value for r in records], expected)
    assert len(dead) == 1, [r.headers for r in dead]
    headers = {k: v.decode() for k, v in dead[0].headers}
    assert headers["loopwarden.kind"] == "batch_too_large", headers
    where = f"{t['events']}[0] offsets {sent.offset}..{sent.offset} (gzip)"
    assert where in headers["loopwarden.reason"], headers
    assert f"--max-batch-bytes {2 * MIB}" in headers["loopwarden.reason"], headers
    assert (headers["loopwarden.source.topic"], headers["loopwarden.source.offset"]) == (t["events"], str(sent.offset))
    assert dead[0].value == b""
    assert len(logged) == 1 and logged[0]["kind"] == "batch_too_large" and logged[0]["offset"] == str(sent.offset)
    grown = peak_after - peak_before
    assert grown < expanded // 2, f"peak resident memory grew by {grown} bytes"
    record_figures(
        "compressed_batch_bound",
        fault="64 MiB of zeros gzip'd in one record between valid events; --max-batch-bytes 2 MiB",
        events=len(trace) + 1,
        **figures,
        dead_lettered=1,
        reason=headers["loopwarden.reason"],
        peak_rss_before=peak_before,
        peak_rss_grown=grown,
    )


# -- config safety -------------------------------------------------------------

BAD_CONFIGS = [
    ({"tools": {"loopDetection": {"warningThreshold": "ten"}}}, "tools.loopDetection.warningThreshold"),
    ({"tools": {"loopDetection": {"historySize": 0}}}, "tools.loopDetection.historySize"),
    ({"tools": {"loopDetection": {"criticalThreshold": 2.5}}}, "tools.loopDetection.criticalThreshold"),
    ({"tools": {"loopDetection": {"detectors": {"pingPong": "yes"}}}}, "tools.loopDetection.detectors.pingPong"),
    (
        {"tools": {"loopDetection": {"postCompactionGuard": {"windowSize": -1}}}},
        "tools.loopDetection.postCompactionGuard.windowSize",
    ),
    (
        {"agents": {"list": [{"id": "a", "tools": {"loopDetection": {"bogus": 1}}}]}},
        "agents.list[0].tools.loopDetection.bogus",
    ),
    ({"tools": {"loopDetection": {"enabled": "true"}}}, "tools.loopDetection.enabled"),
]


def test_bad_configs_refuse_to_start_with_the_path(tmp_path: Path) -> None:
    """Each bad config: the worker exits 2 naming the bad field's path,
    without touching Kafka (the bootstrap address is unreachable on purpose)."""
    # Three through the real CLI (a process start each); all of them through
    # the same loader the CLI calls.
    picked = [BAD_CONFIGS[0], BAD_CONFIGS[5]]
    cases = [(json.dumps(doc), path) for doc, path in picked] + [("{ not json", f"cfg-{len(picked)}.json")]

    def run(i_case: tuple[int, tuple[str, str]]) -> tuple[int, str, str]:
        i, (text, path) = i_case
        file = tmp_path / f"cfg-{i}.json"
        file.write_text(text)
        proc = subprocess.run(
            [
                *LOOPWARDEN,
                "worker",
                "--bootstrap",
                "127.0.0.1:1",
                "--config",
                str(file),
                "--data-dir",
                str(tmp_path / f"d{i}"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        return proc.returncode, proc.stderr, path

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(run, enumerate(cases)))
    for code, stderr, path in results:
        assert code == 2, (path, code, stderr[-500:])
        assert path in stderr, (path, stderr[-500:])
    for doc, path in BAD_CONFIGS:
        with pytest.raises(ValueError, match=path.replace("[", r"\[").replace("]", r"\]")):
            load_config(_write(tmp_path / "direct.json", doc))
    record_figures(
        "config_safety",
        fault="bad config at start-up",
        events=0,
        refused_by_cli=len(results),
        refused_by_loader=len(BAD_CONFIGS),
        exit_code=2,
    )


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


# -- state bounds at scale (engine level; the worker applies the same engine) --

SCALE_CONFIG = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "historySize": 30,
            "warningThreshold": 10,
            "criticalThreshold": 20,
            "globalCircuitBreakerThreshold": 30,
            "postCompactionGuard": {"windowSize": 3},
        }
    }
}


def _one_long_run(calls: int, tmp_path: Path) -> dict[str, Any]:
    """One run of ``calls`` tool calls (each with its result, a compaction
    every 5,000): every event goes through decode + apply; the state's
    history, warning keys, guard window and stored size must stay bounded."""
    config = load_config(_write(tmp_path / "scale.json", SCALE_CONFIG)).config
    rng = random.Random(5)
    encoder = msgspec.json.Encoder()
    state: RunState | None = None
    seq = 0
    sizes: list[int] = []
    max_history = max_keys = max_window = verdicts = 0
    started = time.perf_counter()
    for i in range(calls):
        pick = rng.randrange(2000)
        tool = ("exec", "read", "process")[pick % 3]
        args = {"action": "poll", "sessionId": f"s{pick % 7}"} if tool == "process" else {"path": f"/f{pick}"}
        if rng.random() < 0.5:  # a repeated call that changes every 50 calls: new warning keys all along
            tool, args = "exec", {"command": f"make {i // 50}"}
        seq += 1
        call = {
            "type": "tool_call",
            "run_id": "long",
            "seq": seq,
            "tool_call_id": f"c{i}",
            "tool_name": tool,
            "args": args,
        }
        outcome = apply(state, decode_event(encoder.encode(call)), config)
        state = outcome.state
        verdicts += len(outcome.verdicts)
        seq += 1
        result = {
            "type": "tool_result",
            "run_id": "long",
            "seq": seq,
            "tool_call_id": f"c{i}",
            "tool_name": tool,
            "result": {"content": [{"type": "text", "text": f"out {rng.randrange(3)}"}]},
        }
        state = apply(state, decode_event(encoder.encode(result)), config).state
        if i % 5000 == 4999:
            seq += 1
            state = apply(
                state, decode_event(encoder.encode({"type": "compaction", "run_id": "long", "seq": seq})), config
            ).state
        max_history = max(max_history, len(state.history))
        max_keys = max(max_keys, len(state.warning_buckets))
        max_window = max(max_window, len(state.guard_window))
        if i % 1000 == 999:
            sizes.append(len(stored(state)))
    elapsed = time.perf_counter() - started
    assert verdicts == calls
    assert max_history <= 30 and max_keys <= MAX_KEYS and max_window <= 3
    assert max_keys == MAX_KEYS, "the warning-key cap was reached (and held)"
    steady = sizes[len(sizes) // 10 :]  # after the history and key caps are reached
    assert max(steady) <= 1.1 * max(sizes[: max(1, len(sizes) // 10)]) + 64 * MAX_KEYS, sizes
    return {
        "calls": calls,
        "events": seq,
        "max_history": max_history,
        "max_warning_keys": max_keys,
        "max_guard_window": max_window,
        "state_bytes_first": sizes[0],
        "state_bytes_max": max(sizes),
        "state_bytes_last": sizes[-1],
        "seconds": round(elapsed, 1),
    }


def test_long_run_state_is_bounded(tmp_path: Path) -> None:
    figures = _one_long_run(100_000, tmp_path)
    record_figures("long_run_100k_calls", fault="one run, 100,000 tool calls (engine)", **figures)


@pytest.mark.heavy
def test_long_run_state_is_bounded_million(tmp_path: Path) -> None:
    figures = _one_long_run(1_000_000, tmp_path)
    record_figures("long_run_1M_calls", fault="one run, 1,000,000 tool calls (engine)", **figures)


def _many_runs_through_worker(broker, tmp_path: Path, runs: int, timeout: float) -> dict[str, Any]:
    """``runs`` distinct runs (one call each) through the real worker with a
    2 s TTL: every run expires, so the table is emptied by the TTL sweep, and
    an expired run's next event starts afresh."""
    t = names("many")
    config = write_config(tmp_path)
    create_topics(broker.bootstrap, t, 4)
    lines = [
        b'{"type":"tool_call","run_id":"m%07d","seq":1,"tool_call_id":"c1","tool_name":"read","args":{"i":%d}}' % (i, i)
        for i in range(runs)
    ]
    producer = kafka_clients.producer(
        broker.bootstrap, acks=1, enable_idempotence=False, linger_ms=20, batch_size=256 * 1024
    )
    started = time.monotonic()
    try:
        for i, line in enumerate(lines):
            producer.send(t["events"], key=b"m%07d" % i, value=line)
        producer.flush()
    finally:
        producer.close()
    produced = time.monotonic()
    extra = ["--ttl", "2s", "--sweep-interval", "1s"]
    with Worker(broker.bootstrap, t, tmp_path, "w", config=config, extra=extra) as worker:
        worker.wait_for(lambda: summaries(worker).get("events", 0) >= runs, timeout, "all runs processed")
        processed = time.monotonic()
        worker.wait_for(lambda: summaries(worker).get("expired", 0) >= runs, timeout, "every run expired")
        expired_at = time.monotonic()
        counts = summaries(worker)
        rocks_bytes = sum(p.stat().st_size for p in worker.data_dir.rglob("*") if p.is_file())
        assert worker.stop() == 0
    assert counts["events"] == runs and counts["verdicts"] == runs and counts["expired"] == runs, counts
    published = consume(broker.bootstrap, t["decisions"], count=runs, timeout=timeout, settle=0.5)
    figures = check_invariant([r.value for r in published], reference(lines, config))
    return {
        "runs": runs,
        "events": runs,
        "expired": counts["expired"],
        **figures,
        "produce_s": round(produced - started, 1),
        "process_s": round(processed - produced, 1),
        "all_expired_after_s": round(expired_at - processed, 1),
        "rocksdb_dir_bytes_at_end": rocks_bytes,
    }


@pytest.mark.integration
def test_many_runs_expire_by_ttl(broker, tmp_path: Path) -> None:
    figures = _many_runs_through_worker(broker, tmp_path, 3000, 120)
    record_figures("distinct_runs_3k_ttl", fault="3,000 distinct runs, TTL 2 s (worker)", **figures)


@pytest.mark.heavy
@pytest.mark.integration
def test_many_runs_expire_by_ttl_million(broker, tmp_path: Path) -> None:
    figures = _many_runs_through_worker(broker, tmp_path, 1_000_000, 3600)
    record_figures("distinct_runs_1M_ttl", fault="1,000,000 distinct runs, TTL 2 s (worker)", **figures)
