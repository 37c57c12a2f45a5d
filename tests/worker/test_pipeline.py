"""The stream processor end to end, against the real broker.

Workers run as real `loopwarden worker` subprocesses with their own data
dirs; every test has its own topics and consumer group. What the decision
topic carries is compared, per run and in order, with `loopwarden replay`
(after dropping repeated (run_id, seq) verdicts, which must be byte-identical
to the first).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (
    LOOPWARDEN,
    REPO,
    Worker,
    by_run,
    consume,
    make_trace,
    names,
    produce,
    reference,
    values,
    write_config,
)
import stories
from schemas.codec import encode_verdict
from schemas.configfile import load_config
from schemas.policyfile import load_policy
from streams.kafka.topics import Topics
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration


def _topics(broker, t: dict[str, str], partitions: int) -> None:
    ensure_topics(
        broker.bootstrap,
        Topics(events=t["events"], decisions=t["decisions"], deadletter=t["deadletter"], partitions=partitions),
    )


def _assert_same(got: list[bytes], expected: list[bytes]) -> None:
    got_runs, want_runs = by_run(got), by_run(expected)
    assert sorted(got_runs) == sorted(want_runs)
    for run, lines in want_runs.items():
        assert got_runs[run] == lines, f"run {run} differs from replay"


def test_end_to_end_matches_replay(broker, tmp_path: Path) -> None:
    """A multi-run trace (interleaved runs, every detector, compaction loops,
    run_end, duplicates) gives exactly what replay gives; the CLI creates the
    topics and publishes the trace; the operator log has one line per thing
    that matters and none per healthy event."""
    t = names("e2e")
    config = write_config(tmp_path)
    lines = make_trace(runs=32, events_per_run=24, seed=1)
    expected = reference(lines, config)
    create = subprocess.run(
        [
            *LOOPWARDEN,
            "topics",
            "create",
            "--bootstrap",
            broker.bootstrap,
            "--partitions",
            "4",
            "--events-topic",
            t["events"],
            "--decisions-topic",
            t["decisions"],
            "--deadletter-topic",
            t["deadletter"],
            "--incidents-topic",
            t["incidents"],
            "--incidents-partitions",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert create.returncode == 0, create.stderr
    assert create.stdout.splitlines() == [
        f"created {t['events']} (4 partitions)",
        f"created {t['decisions']} (4 partitions)",
        f"created {t['deadletter']} (4 partitions)",
        f"created {t['incidents']} (2 partitions)",
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join(lines) + b"\n")
    sent = subprocess.run(
        [*LOOPWARDEN, "produce", "--bootstrap", broker.bootstrap, "--topic", t["events"], str(trace)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr

    with Worker(broker.bootstrap, t, tmp_path, "w1", config=config) as worker:
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
        worker.wait_for(lambda: worker.processed() >= len(lines), 30, "summary of all events")
    _assert_same(values(records), expected)
    assert all(r.key == json.loads(r.value)["run_id"].encode() for r in records), "verdicts keyed by run_id"

    log = worker.log()
    decisions = [json.loads(v)["decision"] for v in expected]
    assert len(worker.lines("block")) == decisions.count("block") > 0
    assert len(worker.lines("abort")) == decisions.count("abort") > 0
    assert len(worker.lines("warn")) == decisions.count("warn") > 0
    armed = worker.lines("guard_armed")
    assert armed and armed[0]["msg"].startswith("post-compaction guard armed for 3 attempts")
    assert "event=deadletter " not in log
    # its start in two lines: partitions assigned, then the table recovered and events taken
    assigned, ready = worker.lines("assigned"), worker.lines("ready")
    assert assigned and ready and assigned[-1]["partitions"] == ready[-1]["partitions"] == "0,1,2,3"
    assert log.index("event=assigned") < log.index("event=ready")
    operator_lines = [line for line in log.splitlines() if "logger=loopwarden" in line]
    assert len(operator_lines) < len(lines) - decisions.count("allow"), "no line per healthy event"
    assert "level=debug" not in log
    corrected = worker.lines("config_corrected")
    assert len(corrected) == 1 and "agents.list[1].tools.loopDetection.criticalThreshold" in corrected[0]["msg"]


def test_two_workers_share_the_partitions(broker, tmp_path: Path) -> None:
    """Two workers in one group on a 6-partition topic: each partition (so
    each run) is handled by exactly one worker, every event is processed
    once, and the union of their verdicts is the replay."""
    t = names("pair")
    config = write_config(tmp_path)
    _topics(broker, t, 6)
    lines = make_trace(runs=40, events_per_run=20, seed=2, prefix="pair")
    expected = reference(lines, config)
    # b joins after a owns every partition: the rebalance that follows is
    # where an unpatched Faust lost the head of partitions with no commit yet.
    with Worker(broker.bootstrap, t, tmp_path, "a", config=config, partitions=6) as a:
        a.wait_assigned(60)
        with Worker(broker.bootstrap, t, tmp_path, "b", config=config, partitions=6) as b:

            def balanced() -> bool:
                mine_a, mine_b = a.assignments(), b.assignments()
                if not mine_a or not mine_b:
                    return False
                last_a, last_b = mine_a[-1], mine_b[-1]
                return bool(last_a) and bool(last_b) and not last_a & last_b and last_a | last_b == set(range(6))

            a.wait_for(balanced, 60, "a balanced assignment over both workers")
            split = (a.assignments()[-1], b.assignments()[-1])
            produce(broker.bootstrap, t["events"], lines)
            records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
            assert b.stop() == 0
        assert a.stop() == 0
    _assert_same(values(records), expected)
    assert len(records) == len(expected), "no verdict published twice in a clean run"
    final = {w.name: int(w.lines("summary")[-1]["events"]) for w in (a, b)}
    assert all(n > 0 for n in final.values()), final
    assert sum(final.values()) == len(lines), f"every event processed exactly once: {final}"
    assert split[0].isdisjoint(split[1]) and split[0] | split[1] == set(range(6))


def test_restart_and_crash_continue_each_run(broker, tmp_path: Path) -> None:
    """Counts continue across a graceful restart (state from RocksDB) and
    across a crash (SIGKILL mid-trace) followed by a worker with an empty data
    dir (state from the changelog): nothing lost, nothing counted twice, and
    redelivered events give byte-identical verdicts."""
    t = names("restart")
    config = write_config(tmp_path)
    _topics(broker, t, 4)
    lines = make_trace(runs=24, events_per_run=40, seed=3, prefix="rs")
    expected = reference(lines, config)
    third = len(lines) // 3
    parts = [lines[:third], lines[third : 2 * third], lines[2 * third :]]
    count_upto = [len(reference(lines[: len(p0)], config)) for p0 in (parts[0], parts[0] + parts[1])]

    workers: list[Worker] = []
    try:
        first = Worker(broker.bootstrap, t, tmp_path, "first", config=config)
        workers.append(first.start())
        produce(broker.bootstrap, t["events"], parts[0])
        consume(broker.bootstrap, t["decisions"], count=count_upto[0], timeout=60)
        assert first.stop() == 0  # graceful: offsets committed, state in RocksDB
        assert "final counts" in first.log()

        again = Worker(broker.bootstrap, t, tmp_path, "first", config=config)  # same data dir
        workers.append(again.start())
        produce(broker.bootstrap, t["events"], parts[1])
        got = consume(broker.bootstrap, t["decisions"], count=count_upto[0] + 20, timeout=60)
        assert len(got) >= count_upto[0] + 20
        again.stop(signal.SIGKILL)  # a crash somewhere in the middle of part 2

        fresh = Worker(broker.bootstrap, t, tmp_path, "fresh", config=config)  # empty data dir
        workers.append(fresh.start())
        produce(broker.bootstrap, t["events"], parts[2])
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=120, settle=2.0)
        assert fresh.stop() == 0
    finally:
        for worker in workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.stop(signal.SIGKILL)
    _assert_same(values(records), expected)


def test_malformed_events_are_dead_lettered(broker, tmp_path: Path) -> None:
    """Each malformed event lands on the dead-letter topic with its reason
    and original bytes, is counted, and the next valid event is processed;
    idle runs expire after the TTL (a redelivered old seq then starts a new
    history instead of being a duplicate)."""
    t = names("dlq")
    config = write_config(tmp_path)
    _topics(broker, t, 2)
    valid = make_trace(runs=3, events_per_run=10, seed=4, prefix="ok")
    huge = json.dumps(
        {
            "type": "tool_call",
            "run_id": "big",
            "seq": 1,
            "tool_call_id": "c",
            "tool_name": "t",
            "args": {"blob": "x" * 20_000},
        }
    ).encode()
    call = {"type": "tool_call", "run_id": "bad", "seq": 1, "tool_call_id": "c1", "tool_name": "exec"}
    bad: list[tuple[bytes, bytes | None, str]] = [
        (b"this is not json", b"bad", "not_json"),
        (json.dumps({**call, "seq": "one"}).encode(), b"bad", "invalid"),
        (json.dumps({k: v for k, v in call.items() if k != "run_id"}).encode(), b"bad", "invalid"),
        (json.dumps({**call, "type": "tool_cal"}).encode(), b"bad", "unknown_type"),
        (
            b'{"type":"tool_call","run_id":"bad","seq":1,"tool_call_id":"c","tool_name":"t","args":'
            + b"[" * 3000
            + b"]" * 3000
            + b"}",
            b"bad",
            "not_json",
        ),
        (
            b'{"type":"tool_call","run_id":"bad","seq":1,"tool_call_id":"c","tool_name":"t","args":'
            + b"[" * 600
            + b"12345678901234567"
            + b"]" * 600
            + b"}",
            b"bad",
            "not_json",
        ),
        (json.dumps({**call, "seq": 2**70}).encode(), b"bad", "invalid"),
        (huge, b"big", "too_large"),
        (json.dumps({**call, "run_id": "other"}).encode(), b"bad", "key_mismatch"),
        (json.dumps({**call, "turn": None}).encode(), b"bad", "invalid_turn"),
        (json.dumps({**call, "turn": "t" * 257}).encode(), b"bad", "invalid_turn"),
    ]
    # Bad events between the valid ones: every valid event is still processed.
    stream: list[tuple[bytes, bytes | None]] = []
    for i, line in enumerate(valid):
        stream.append((line, json.loads(line)["run_id"].encode()))
        if i < len(bad):
            stream.append(bad[i][:2])
    # TTL: a run ends, is expired, and then an old seq of it comes again.
    ttl_run = [
        json.dumps({"type": "tool_call", "run_id": "ttl", "seq": 1, "tool_call_id": "c1", "tool_name": "read"}),
        json.dumps({"type": "run_end", "run_id": "ttl", "seq": 2}),
        json.dumps({"type": "tool_call", "run_id": "ttl", "seq": 1, "tool_call_id": "c1", "tool_name": "read"}),
    ]
    stream += [(line.encode(), b"ttl") for line in ttl_run[:2]]
    refused = {line for line, _, _ in bad}
    expected = reference([line for line, _ in stream if line not in refused], config)

    worker = Worker(
        broker.bootstrap,
        t,
        tmp_path,
        "w",
        config=config,
        partitions=2,
        extra=["--max-event-bytes", "10000", "--ttl", "2s", "--sweep-interval", "0.5s"],
    )
    with worker:
        produce(broker.bootstrap, t["events"], [line for line, _ in stream], keys=[key for _, key in stream])
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=60, settle=0.5)
        _assert_same(values(records), expected)

        dead = consume(broker.bootstrap, t["deadletter"], count=len(bad), timeout=30, settle=0.5)
        assert len(dead) == len(bad)
        by_value = {r.value: r for r in dead}
        for original, key, kind in bad:
            record = by_value[original]  # the original bytes, unchanged
            headers = {k: v.decode() for k, v in record.headers}
            assert record.key == key
            assert headers["loopwarden.kind"] == kind, headers
            assert headers["loopwarden.reason"]
            assert headers["loopwarden.source.topic"] == t["events"]
            assert int(headers["loopwarden.source.offset"]) >= 0
        worker.wait_for(
            lambda: int((worker.lines("summary") or [{}])[-1].get("deadlettered", 0)) == len(bad),
            15,
            "dead letters counted",
        )
        assert len(worker.lines("deadletter")) == len(bad)

        # The TTL: once expired, seq 1 of "ttl" is a new run's first call.
        runs = len({json.loads(line)["run_id"] for line, _ in stream if line not in refused})
        worker.wait_for(lambda: sum(int(x["runs"]) for x in worker.lines("expired")) >= runs, 30, "idle runs expired")
        produce(broker.bootstrap, t["events"], [ttl_run[2].encode()], keys=[b"ttl"])
        after = consume(broker.bootstrap, t["decisions"], count=len(expected) + 1, timeout=30)
        ttl_verdicts = [json.loads(r.value) for r in after if r.key == b"ttl"]
        assert [(v["seq"], v["decision"]) for v in ttl_verdicts] == [(1, "allow"), (1, "allow")]
        assert worker.proc is not None and worker.proc.poll() is None, "the worker never crashed on input"

    cli = subprocess.run(
        [
            *LOOPWARDEN,
            "tail",
            "--bootstrap",
            broker.bootstrap,
            "--deadletter",
            "--deadletter-topic",
            t["deadletter"],
            "--from-beginning",
            "--max",
            str(len(bad)),
            "--timeout",
            "30s",
        ],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    shown = [json.loads(line) for line in cli.stdout.splitlines()]
    assert {entry["kind"] for entry in shown} == {kind for _, _, kind in bad}
    assert any(entry["value"] == "this is not json" for entry in shown)


@pytest.mark.parametrize(
    ("flag", "document", "path"),
    [
        ("--config", {"tools": {"loopDetection": {"warningThreshold": "ten"}}}, "tools.loopDetection.warningThreshold"),
        (
            "--policy",
            {"agents": {"cheap-model": {"escalation": {"window": 2}}}},
            "agents.cheap-model.escalation.window: must be at least blockedCalls (3), got 2",
        ),
    ],
)
def test_bad_config_or_policy_refuses_to_start(tmp_path: Path, flag: str, document: dict, path: str) -> None:
    """A config or policy with a bad field: exit 2 naming the field's path,
    before anything connects to Kafka."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    started = time.monotonic()
    proc = subprocess.run(
        [*LOOPWARDEN, "worker", "--bootstrap", "127.0.0.1:1", flag, str(bad), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2
    assert path in proc.stderr
    assert time.monotonic() - started < 30


def test_exactly_once_matches_replay(broker, tmp_path: Path) -> None:
    """With Kafka transactions the verdicts (read committed) are replay's too:
    each partition's transactional producer exists before its first event."""
    t = names("eos")
    config = write_config(tmp_path)
    lines = make_trace(runs=24, events_per_run=20, seed=5)
    expected = reference(lines, config)
    _topics(broker, t, 4)
    produce(broker.bootstrap, t["events"], lines)
    worker = Worker(
        broker.bootstrap, t, tmp_path, "eos", config=config, extra=["--processing-guarantee", "exactly_once"]
    )
    with worker:
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
        assert "event=fatal" not in worker.log()
    _assert_same(values(records), expected)


def test_spec7_loops_match_replay(broker, tmp_path: Path) -> None:
    """The loops of spec §7 (an exec retried with other flags, argument churn,
    unchanged writes, fresh untrusted-content ids, a blocked call retried) give
    through a worker exactly what replay gives, with the gateway's default
    thresholds: veto records, the exec walk and argument_churn included.
    Recovery is off, so that a blocked call retried reaches the breaker."""
    from bench.fleet_trace import generate_lines

    t = names("spec7")
    config = write_config(tmp_path, {"tools": {"loopDetection": {"enabled": True}}})
    policy = _policy(tmp_path, "policy.json", {"recovery": {"enabled": False}})
    mix = dict.fromkeys(("exec_flags", "argument_churn", "unchanged_write", "untrusted_fetch", "stuck_retry"), 1.0)
    lines = [line.rstrip(b"\n") for line in generate_lines(runs=15, events=1500, seed=7, mix=mix)]
    expected = reference(lines, config, policy)
    fired = {(v["decision"], v["detector"]) for v in map(json.loads, expected)}
    assert {("warn", "argument_churn"), ("block", "global_circuit_breaker"), ("block", "generic_repeat")} <= fired
    _topics(broker, t, 4)
    produce(broker.bootstrap, t["events"], lines)
    with Worker(broker.bootstrap, t, tmp_path, "w1", config=config, extra=["--policy", str(policy)]):
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
    _assert_same(values(records), expected)


def test_section8_stories_match_replay(broker, tmp_path: Path) -> None:
    """Spec §8 through a worker: the table's rows end in loop_recovery_exhausted
    at the turn after their first block, a ping-pong 60 calls long stays
    blocked from its first block, a latch is released by another call that
    runs, exactly as replay and the engine decide them."""
    t = names("turns")
    config = write_config(tmp_path, {"tools": {"loopDetection": {"enabled": True}}})
    policy = _policy(tmp_path, "policy.json", stories.POLICY)
    lines, plays = stories.section_8_trace(load_config(config).config, load_policy(policy))
    expected = reference(lines, config, policy)
    assert by_run(expected) == {run: [encode_verdict(v) for v in story.verdicts] for run, story in plays.items()}
    _topics(broker, t, 3)
    produce(broker.bootstrap, t["events"], lines)
    with Worker(broker.bootstrap, t, tmp_path, "w1", config=config, partitions=3, extra=["--policy", str(policy)]):
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
    _assert_same(values(records), expected)
    published = {run: [json.loads(line) for line in verdicts] for run, verdicts in by_run(values(records)).items()}
    assert {published[f"row-{n}"][-1]["error"] for n in range(1, 7)} == {"loop_recovery_exhausted"}
    assert [v["decision"] for v in published["long-ping-pong"][19:]] == ["block"] * 41
    released = [v["decision"] for v in published["released"]]
    assert released[19:22] == [
        "block",
        "allow",
        "warn",
    ]  # after the exec ran, the read is judged afresh: warned, not latched


POLICY = {
    "recovery": {"enabled": False},  # escalation would never see a second block: recovery ends the run first
    "escalation": {"enabled": True, "blockedCalls": 2, "window": 6},
    "budget": {"maxToolCalls": 10},
}


def _policy(directory: Path, name: str, document: dict) -> Path:
    path = directory / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_shadow_policy_through_the_worker(broker, tmp_path: Path) -> None:
    """Shadow mode publishes what replay does, every decision `allow`, and its
    `shadow_decision` is what enforce mode decides for the same trace up to
    the first divergence."""
    t = names("shadow")
    config = write_config(tmp_path)
    shadow = _policy(tmp_path, "shadow.json", {"mode": "shadow", **POLICY})
    enforce = _policy(tmp_path, "enforce.json", POLICY)
    lines = make_trace(runs=24, events_per_run=24, seed=3)
    expected = reference(lines, config, shadow)
    _topics(broker, t, 4)
    produce(broker.bootstrap, t["events"], lines)
    with Worker(broker.bootstrap, t, tmp_path, "w1", config=config, extra=["--policy", str(shadow)]):
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
    published = by_run(values(records))
    assert published == by_run(expected), "the worker publishes what replay writes"

    shadowed = [json.loads(v) for run in published.values() for v in run]
    assert {v["decision"] for v in shadowed} == {"allow"}
    assert {v["error"] for v in shadowed} == {None}
    assert {"warn", "block", "abort"} <= {v["shadow_decision"] for v in shadowed}
    would_abort = {v["detector"] for v in shadowed if v["shadow_decision"] == "abort"}
    assert {"tool_call_budget", "blocks_ignored"} <= would_abort

    enforced = by_run(reference(lines, config, enforce))
    compared = 0
    for run, verdicts in published.items():
        for shadow_line, enforce_line in zip(verdicts, enforced[run], strict=False):
            s, e = json.loads(shadow_line), json.loads(enforce_line)
            assert s["seq"] == e["seq"]
            assert s["shadow_decision"] == (None if e["decision"] == "allow" else e["decision"]), (run, s, e)
            assert (s["detector"], s["count"], s["message"]) == (e["detector"], e["count"], e["message"])
            compared += 1
            if e["decision"] in ("block", "abort"):
                break  # enforce mode's gateway did not run this call: the runs part here
    assert compared > len(published)
