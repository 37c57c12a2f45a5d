"""`loopwarden audit` against a real broker.

The published verdicts come from `EmulatedWorker` (the engine itself, which
can be told to misbehave) and, in `test_audit_real_worker`, from the real
`loopwarden worker`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from schemas.config import FleetConfig, LoopDetectionConfig
from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
from streams.tools.audit import compare, parse_since, run_audit
from streams.cli import main as cli_main
from schemas.configfile import load_config

from emulated_worker import EmulatedWorker, RealWorker, make_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-trace.jsonl"
SAMPLE_CONFIG = ROOT / "examples" / "loopwarden.json5"


def produce(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    producer = kafka_clients.producer(bootstrap, acks="all", linger_ms=5)
    try:
        for line in lines:
            if line.strip():
                try:
                    key = json.loads(line)["run_id"].encode()
                except (ValueError, KeyError, TypeError, AttributeError):
                    key = None
                producer.send(topic, key=key, value=line.strip())
        producer.flush()
    finally:
        producer.close()


def sample_lines() -> list[bytes]:
    return SAMPLE.read_bytes().splitlines()


def wait_processed(worker: EmulatedWorker, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while worker.processed + worker.refused < count:
        assert time.monotonic() < deadline, f"worker processed {worker.processed}/{count}"
        time.sleep(0.05)
    time.sleep(0.3)  # verdicts flushed


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap, group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def audit_cli(broker, topics, *extra: str) -> list[str]:
    return [
        "audit",
        "--bootstrap",
        broker.bootstrap,
        "--events-topic",
        topics["events"],
        "--decisions-topic",
        topics["decisions"],
        "--wait",
        "1s",
        *extra,
    ]


def group_ids(bootstrap: str) -> set[str]:
    admin = kafka_clients.admin(bootstrap)
    try:
        return {g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()}
    finally:
        admin.close()


def test_clean_audit_passes(broker, capsys):
    topics = make_topics(broker.bootstrap)
    config = load_config(SAMPLE_CONFIG).config
    lines = sample_lines()
    groups_before = group_ids(broker.bootstrap)
    with EmulatedWorker(broker.bootstrap, topics, config) as worker:
        produce(broker.bootstrap, topics["events"], lines)
        wait_processed(worker, len(lines))
    code = cli_main(audit_cli(broker, topics, "--from-beginning", "--config", str(SAMPLE_CONFIG)))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "events read: 150 in 6 runs" in out
    assert "OK: all 73 recomputed verdicts match what was published" in out
    # the audit joined no consumer group (manual assignment only)
    assert group_ids(broker.bootstrap) == groups_before


def tamper_factory():
    """Drop one verdict, turn a block into an allow, publish one verdict
    twice identically (fine) and one twice differently (conflict), and add
    a verdict for a tool_result that got none."""

    def tamper(v: Verdict) -> list[Verdict]:
        key = (v.run_id, v.seq)
        if key == ("run-healthy", 3):
            return []  # missing
        if v.run_id == "run-repeat" and v.decision == "block":
            if v.seq == 33:
                return [msgspec.structs.replace(v, decision="allow", level="none")]  # different
        if key == ("run-poll", 1):
            return [v, v]  # identical redelivery: not a mismatch
        if key == ("run-poll", 3):
            return [v, msgspec.structs.replace(v, count=99)]  # conflict
        if key == ("run-healthy", 5):
            return [v, msgspec.structs.replace(v, seq=6)]  # extra: seq 6 is a tool_result
        return [v]

    return tamper


def test_audit_finds_every_mismatch(broker, capsys):
    topics = make_topics(broker.bootstrap)
    config = load_config(SAMPLE_CONFIG).config
    lines = sample_lines()
    with EmulatedWorker(broker.bootstrap, topics, config, tamper=tamper_factory()) as worker:
        produce(broker.bootstrap, topics["events"], lines)
        wait_processed(worker, len(lines))
    report = run_audit(
        broker.bootstrap, config, events_topic=topics["events"], decisions_topic=topics["decisions"], wait=1
    )
    kinds = {(m.kind, m.run_id, m.seq) for m in report.mismatches}
    blocked = [m for m in report.mismatches if m.kind == "different"]
    assert ("missing", "run-healthy", 3) in kinds
    assert ("extra", "run-healthy", 6) in kinds
    assert ("conflict", "run-poll", 3) in kinds
    assert len(report.mismatches) == 4, kinds
    assert len(blocked) == 1 and blocked[0].fields == ["decision", "level"]
    assert report.published.duplicates == 1
    assert report.waited >= 1  # it waited for the missing verdict before reporting it

    code = cli_main(audit_cli(broker, topics, "--config", str(SAMPLE_CONFIG)))
    out = capsys.readouterr().out
    assert code == 1
    assert "MISSING   run=run-healthy seq=3 exec: recomputed allow, nothing published" in out
    assert "EXTRA     run=run-healthy seq=6 write: published allow, nothing recomputed" in out
    assert "DIFFERENT run=run-repeat seq=33" in out and '[decision "allow" -> "block"' in out
    assert "CONFLICT  run=run-poll seq=3" in out
    assert "MISMATCH: 4 verdicts differ (1 conflict, 1 different, 1 extra, 1 missing) in 3 runs" in out
    assert "(+1 identical re-deliveries)" in out


def test_what_if_another_config(broker, capsys, tmp_path):
    """Audit with a config the worker did not use: the differences are what
    that config would have decided."""
    topics = make_topics(broker.bootstrap)
    lines = sample_lines()
    with EmulatedWorker(broker.bootstrap, topics, load_config(SAMPLE_CONFIG).config) as worker:
        produce(broker.bootstrap, topics["events"], lines)
        wait_processed(worker, len(lines))
    stricter = tmp_path / "stricter.json"
    stricter.write_text(
        json.dumps({"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}})
    )
    code = cli_main(audit_cli(broker, topics, "--config", str(stricter), "--summary-only"))
    out = capsys.readouterr().out
    assert code == 1
    assert "DIFFERENT run=" not in out  # --summary-only
    assert "published -> recomputed" in out
    assert "allow -> block" in out
    code = cli_main(audit_cli(broker, topics, "--config", str(stricter), "--json"))
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and not doc["ok"]
    assert doc["mismatches_by_kind"] == {"different": len(doc["mismatches"])}
    assert any(d["published"] == "allow" and d["recomputed"] == "block" for d in doc["differences"])
    # the workers' own config: no differences
    assert cli_main(audit_cli(broker, topics, "--config", str(SAMPLE_CONFIG), "--summary-only")) == 0


def test_since_skips_runs_started_before(broker, capsys, tmp_path):
    """--since: a run that started before the point is named and not
    compared; a run that starts after it is audited exactly."""
    topics = make_topics(broker.bootstrap, partitions=1)
    tight = FleetConfig(
        default=LoopDetectionConfig(
            enabled=True, warning_threshold=3, critical_threshold=5, global_circuit_breaker_threshold=6
        )
    )

    def run(run_id: str, first: int, n: int) -> list[bytes]:
        out = []
        for i in range(first, first + n):
            out.append(
                json.dumps(
                    {
                        "type": "tool_call",
                        "run_id": run_id,
                        "seq": 2 * i,
                        "tool_call_id": f"c{i}",
                        "tool_name": "exec",
                        "args": {"c": "make"},
                    }
                ).encode()
            )
            out.append(
                json.dumps(
                    {
                        "type": "tool_result",
                        "run_id": run_id,
                        "seq": 2 * i + 1,
                        "tool_call_id": f"c{i}",
                        "tool_name": "exec",
                        "result": {"content": [{"type": "text", "text": "x"}]},
                    }
                ).encode()
            )
        return out

    with EmulatedWorker(broker.bootstrap, topics, tight) as worker:
        produce(broker.bootstrap, topics["events"], run("old", 0, 4))
        wait_processed(worker, 8)
        time.sleep(1.1)
        since = int(time.time() * 1000)
        time.sleep(0.1)
        produce(broker.bootstrap, topics["events"], run("old", 4, 3) + run("new", 0, 7))
        wait_processed(worker, 8 + 6 + 14)
    config_file = tmp_path / "tight.json"
    config_file.write_text(
        json.dumps(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 3,
                        "criticalThreshold": 5,
                        "globalCircuitBreakerThreshold": 6,
                    }
                }
            }
        )
    )
    args = audit_cli(broker, topics, "--since", str(since), "--config", str(config_file))
    code = cli_main(args)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "warning: 1 runs started before the start point and were not compared: old (first seq 8)" in out
    assert "recomputed: 7 verdicts for 1 runs" in out
    # recomputing "old" from the point would have been wrong: its history is before it
    wrong = run_audit(
        broker.bootstrap,
        tight,
        since_ms=since,
        events_topic=topics["events"],
        decisions_topic=topics["decisions"],
        wait=0,
        first_seq=100,
    )
    assert wrong.mismatches and {m.run_id for m in wrong.mismatches} == {"old"}
    # --run narrows the audit to one run
    assert cli_main(audit_cli(broker, topics, "--run", "new", "--config", str(config_file))) == 0
    assert "events read: 14 in 1 runs" in capsys.readouterr().out


def test_audit_errors(broker, capsys):
    assert (
        cli_main(["audit", "--bootstrap", broker.bootstrap, "--events-topic", "no-such-topic-" + uuid.uuid4().hex[:6]])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # checked when the arguments are parsed
        cli_main(["audit", "--bootstrap", broker.bootstrap, "--since", "yesterday-ish"])
    assert exited.value.code == 2
    assert "argument --since: expected earliest, latest, a time" in capsys.readouterr().err


def test_parse_since_forms():
    now = 1_700_000_000.0
    assert parse_since("15m", now) == int((now - 900) * 1000)
    assert parse_since("2h ago", now) == int((now - 7200) * 1000)
    assert parse_since("1700000000", now) == 1_700_000_000_000
    assert parse_since("1700000000123", now) == 1_700_000_000_123
    assert parse_since("2023-11-14T22:13:20Z", now) == 1_700_000_000_000
    assert parse_since("2023-11-14T22:13:20", now) == 1_700_000_000_000


def test_compare_is_exact():
    v = Verdict(run_id="r", seq=1, tool_call_id="c", tool_name="t", decision="allow")
    assert compare({("r", 1): v}, {("r", 1): [v]}) == []
    changed = msgspec.structs.replace(v, message="x")
    [m] = compare({("r", 1): v}, {("r", 1): [changed]})
    assert m.kind == "different" and m.fields == ["message"]


# --------------------------------------------------------------------------
# With the real worker
# --------------------------------------------------------------------------


def test_audit_real_worker(broker, tmp_path, capsys):
    """The real worker's verdicts for the sample trace pass the audit, and
    the audit leaves the worker's consumer group and offsets as they were."""
    topics = make_topics(broker.bootstrap, partitions=3)
    with RealWorker(broker.bootstrap, topics, tmp_path, "--config", str(SAMPLE_CONFIG)) as worker:
        produce(broker.bootstrap, topics["events"], sample_lines())
        deadline = time.monotonic() + 120
        report = None
        while time.monotonic() < deadline:
            assert worker.alive(), worker.log_tail()
            report = run_audit(
                broker.bootstrap,
                load_config(SAMPLE_CONFIG).config,
                events_topic=topics["events"],
                decisions_topic=topics["decisions"],
                wait=0,
            )
            if report.ok:
                break
            time.sleep(1)
        assert report is not None and report.ok, [(m.kind, m.run_id, m.seq) for m in report.mismatches][:10]
        admin = kafka_clients.admin(broker.bootstrap)
        try:
            # wait until the worker has committed everything it read, so that
            # its own periodic commits cannot move the offsets during the audit
            ends = {p: o for p, o in end_offsets(broker.bootstrap, topics["events"]).items() if o > 0}
            deadline = time.monotonic() + 60
            while True:
                before = admin.list_group_offsets(worker.app_id)
                committed = {
                    tp.partition: om.offset
                    for tp, om in before.get(worker.app_id, {}).items()
                    if tp.topic == topics["events"]
                }
                if committed == ends:
                    break
                assert time.monotonic() < deadline, (committed, ends)
                time.sleep(0.5)
            assert cli_main(audit_cli(broker, topics, "--config", str(SAMPLE_CONFIG))) == 0
            assert "OK: all 73 recomputed verdicts match" in capsys.readouterr().out
            time.sleep(0.5)
            assert admin.list_group_offsets(worker.app_id) == before
        finally:
            admin.close()
