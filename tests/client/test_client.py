"""The gateway client against a real broker.

The worker is emulated with the engine itself (`EmulatedWorker`: the same
`apply` and codec the stream processor uses), so these tests pin the client's
behaviour: seq numbering, verdict matching, dedupe, fallback policies, local
hashing. `test_client_with_real_worker` runs the real `loopwarden worker`
when the command exists.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path

import msgspec
import pytest

from schemas.config import FleetConfig, LoopDetectionConfig
from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT
from streams.kafka.reader import TopicReader
from streams.tools.broker import LocalBroker, free_port
from streams.client import ClientVerdict, GuardClient, minimal_args
from schemas.codec import decode_verdict
from streams.tools.replay import replay

from emulated_worker import EmulatedWorker, RealWorker, make_topics

pytestmark = pytest.mark.integration

TIGHT = FleetConfig(
    default=LoopDetectionConfig(
        enabled=True, warning_threshold=3, critical_threshold=5, global_circuit_breaker_threshold=6
    )
)


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes]]:
    """Everything on a topic right now, partition by partition."""
    with TopicReader(bootstrap, "loopwarden-tests", PLAINTEXT) as reader:
        return [(record.key, record.value) for record in reader.whole(topic)]


def wire(v: Verdict) -> Verdict:
    """The wire part of a ClientVerdict (drops the client's fallback fields)."""
    return Verdict(**{name: getattr(v, name) for name in Verdict.__struct_fields__})


def scripted_run(client: GuardClient, run_id: str, agent_id: str | None = None) -> list[ClientVerdict]:
    """An agent that loops in several ways; returns every check's verdict."""
    verdicts = []

    def step(tool, args, result=None, error=None):
        call = client.tool_call(run_id, tool, args, agent_id=agent_id)
        verdict = client.check(call)
        verdicts.append(verdict)
        if verdict.allowed:
            if error is not None:
                client.tool_result(call, error=error)
            else:
                client.tool_result(call, result=result)
        return verdict

    # floats and key order must hash the same locally and in the worker
    for i in range(2):
        step(
            "search",
            {"q": "kafka", "limit": 10.0, "w": {"b": 1.5, "a": [1.0, 2]}},
            {"content": [{"type": "text", "text": f"page {i}"}], "details": {"score": 0.5}},
        )
    # a poll that never progresses
    for _ in range(6):
        step(
            "process",
            {"action": "poll", "sessionId": "s1"},
            {"content": [{"type": "text", "text": "still running"}], "details": {"status": "running", "pid": 7}},
        )
    # sends whose only change is a fresh message id
    for i in range(4):
        step(
            "message",
            {"action": "send", "to": "ops", "text": "deploy?"},
            {"details": {"ok": True, "messageId": f"m{i}", "ts": 1000.5 + i}},
        )
    # a tool that does not exist
    for _ in range(3):
        step("frobnicate", {"x": 1}, error='Unknown tool: "frobnicate"')
    # identical exec with identical output: warns, then blocks
    for _ in range(7):
        step(
            "exec",
            {"command": "make test"},
            {
                "content": [{"type": "text", "text": "FAIL"}],
                "details": {"status": "completed", "exitCode": 1, "durationMs": 1234.5, "aggregated": "FAIL"},
            },
        )
    return verdicts


@pytest.fixture
def topics(broker):
    return make_topics(broker.bootstrap)


def test_verdicts_match_offline_replay(broker, topics):
    """Every check returns the verdict the engine computes for the events
    that are actually on the topic (replayed offline)."""
    with (
        EmulatedWorker(broker.bootstrap, topics, TIGHT),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        got = scripted_run(client, "run-full")
        client.run_end("run-full")
        client.flush()
        assert client.stats["fail_open"] == 0 and client.stats["timeouts"] == 0
    decisions = [v.decision for v in got]
    assert "warn" in decisions and "block" in decisions
    assert [v.seq for v in got] == sorted(v.seq for v in got)

    events = [value + b"\n" for key, value in read_topic(broker.bootstrap, topics["events"])]
    seqs = [json.loads(e)["seq"] for e in events]
    assert seqs == list(range(len(seqs))), "one run, numbered 0, 1, 2 … in publish order"
    out = io.BytesIO()
    assert replay(events, TIGHT, out, io.StringIO()) == 0
    offline = [decode_verdict(line) for line in out.getvalue().splitlines()]
    assert [wire(v) for v in got] == offline


def test_local_hashing_same_verdicts_and_no_payloads(broker, topics):
    """With local hashing the worker decides exactly as with full payloads,
    while nothing but hashes, tool names and {"action"} leaves the gateway."""
    with EmulatedWorker(broker.bootstrap, topics, TIGHT):
        common = dict(events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10)
        with GuardClient(broker.bootstrap, **common) as full:
            full_verdicts = scripted_run(full, "run-A")
        with GuardClient(broker.bootstrap, local_hashing=True, **common) as local:
            local_verdicts = scripted_run(local, "run-B")
    strip = lambda v: (v.decision, v.level, v.detector, v.count, v.warning_key, v.message)  # noqa: E731
    assert [strip(v) for v in local_verdicts] == [strip(v) for v in full_verdicts]

    for key, value in read_topic(broker.bootstrap, topics["events"]):
        event = json.loads(value)
        if key != b"run-B":
            continue
        assert "result" not in event and "error" not in event
        if event["type"] in ("tool_call", "tool_result"):
            assert event["args_hash"].startswith(event["tool_name"] + ":")
            if event["tool_name"] in ("process", "message"):
                assert set(event["args"]) == {"action"}
            else:
                assert "args" not in event
        if event["type"] == "tool_result":
            assert "result_hash" in event
    assert minimal_args("process", {"action": "poll", "sessionId": "secret"}) == {"action": "poll"}


def test_a_turn_is_checked_whole_and_a_loop_back_ends_the_run(broker, topics):
    """Three identical failing reads per model response, published with their
    turn and checked together; the gateway runs a turn only when all of it is
    allowed, else reports every call as vetoed (spec §8.1). The turn after the
    first blocked one is aborted by recovery (§8.3)."""
    veto = {"details": {"status": "blocked", "deniedReason": "tool-loop"}}
    ran, turns = 0, []
    with (
        EmulatedWorker(broker.bootstrap, topics, TIGHT),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        for turn in ("m1", "m2", "m3", "m4"):
            calls = [client.tool_call("run-turns", "read", {"path": "x"}, turn=turn) for _ in range(3)]
            verdicts = client.check_turn(calls)
            turns.append([v.decision for v in verdicts])
            admitted = all(v.allowed for v in verdicts)
            for call in calls:
                client.tool_result(call, **({"error": "ENOENT"} if admitted else {"result": veto}))
            ran += 3 * admitted
            if client.aborted("run-turns") is not None:
                break
        aborted = client.aborted("run-turns")
    assert turns == [["allow"] * 3, ["warn", "allow", "block"], ["abort"] * 3]
    assert ran == 3 and aborted is not None and aborted.error == "loop_recovery_exhausted"
    sent = [json.loads(value) for _, value in read_topic(broker.bootstrap, topics["events"])]
    assert [e["turn"] for e in sent if e["type"] == "tool_call"] == ["m1"] * 3 + ["m2"] * 3 + ["m3"] * 3
    assert all("turn" not in e for e in sent if e["type"] != "tool_call")


@pytest.mark.parametrize("turn", ["", "t" * 257])
def test_a_turn_out_of_bounds_is_refused_before_it_is_sent(turn: str) -> None:
    client = GuardClient("127.0.0.1:1", timeout=0.1)
    with pytest.raises(ValueError, match="turn must be a string of 1 to 256 characters"):
        client.tool_call("r", "read", {"path": "x"}, turn=turn)


def test_timeout_fail_open_and_fail_closed(broker, topics, caplog):
    """No worker answering: the policy decides and the verdict says so."""
    caplog.set_level(logging.WARNING, logger="loopwarden.client")
    common = dict(events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=0.5)
    with GuardClient(broker.bootstrap, policy="fail_open", **common) as client:
        started = time.monotonic()
        verdict = client.check(client.tool_call("r-open", "exec", {"command": "ls"}))
        assert time.monotonic() - started < 2.0
        assert verdict.decision == "allow" and verdict.allowed
        assert verdict.fallback == "fail_open" and verdict.fallback_reason == "timeout"
        assert "fail_open" in verdict.message and "allowed without a loop check" in verdict.message
    assert any("fail_open" in r.getMessage() for r in caplog.records)
    with GuardClient(broker.bootstrap, policy="fail_closed", **common) as client:
        verdict = client.check(client.tool_call("r-closed", "exec", {"command": "ls"}))
        assert verdict.decision == "block" and not verdict.allowed and verdict.level == "critical"
        assert verdict.fallback == "fail_closed"
        assert client.stats["fail_closed"] == 1 and client.stats["timeouts"] == 1


def test_broker_unreachable_falls_back_fast():
    """No broker at all: start() does not hang, publishing fails within the
    timeout and the policy applies with the publish error as reason; close()
    stops the decision reader even though Kafka never answered."""
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    client = GuardClient(dead, timeout=0.5, policy="fail_closed", start_timeout=0.5).start()
    reader = client._reader.thread
    try:
        verdict = client.check(client.tool_call("r1", "exec", {"command": "ls"}))
        assert verdict.decision == "block" and verdict.fallback == "fail_closed"
        assert verdict.fallback_reason.startswith("publish_failed")
        assert time.monotonic() - started < 5
    finally:
        client.close(timeout=1)
    assert reader is not None and not reader.is_alive()


def test_duplicate_verdicts_are_dropped(broker, topics):
    """At-least-once delivery: every verdict published twice; the client
    hands out each once and counts the duplicates."""
    with (
        EmulatedWorker(broker.bootstrap, topics, TIGHT, tamper=lambda v: [v, v]),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        got = [client.check(client.tool_call("r-dup", "exec", {"n": i})) for i in range(5)]
        deadline = time.monotonic() + 5
        while client.stats["duplicates"] < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [v.seq for v in got] == [0, 1, 2, 3, 4]
    assert client.stats["verdicts"] == 5 and client.stats["duplicates"] == 5


def test_late_verdict_after_timeout(broker, topics):
    """A verdict that arrives after its check gave up is counted as late,
    never handed to a later check."""
    with (
        EmulatedWorker(broker.bootstrap, topics, TIGHT, delay=1.0),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=0.3
        ) as client,
    ):
        first = client.check(client.tool_call("r-late", "exec", {"n": 1}))
        assert first.fallback == "fail_open"
        second = client.check(client.tool_call("r-late", "exec", {"n": 2}), timeout=10)
        assert second.fallback is None and second.seq == 1
        deadline = time.monotonic() + 5
        while client.stats["late"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.stats["late"] == 1


def test_compaction_abort_reaches_the_gateway(broker, topics):
    """The post-compaction guard aborts on a tool_result: `tool_result(wait=)`
    returns the abort, `aborted()` remembers it, the next call is answered abort."""
    with (
        EmulatedWorker(broker.bootstrap, topics, FleetConfig()),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        client.compaction("r-cmp")
        outcome = None
        for _ in range(3):
            call = client.tool_call("r-cmp", "read", {"path": "a.txt"})
            assert client.check(call).decision == "allow"
            outcome = client.tool_result(call, result={"content": [{"type": "text", "text": "same"}]}, wait=3)
        assert outcome is not None and outcome.decision == "abort"
        assert outcome.error == "compaction_loop_persisted"
        assert client.aborted("r-cmp") == outcome
        after = client.check(client.tool_call("r-cmp", "read", {"path": "b.txt"}))
        assert after.decision == "abort" and after.fallback is None
        published = client.stats["published"]
        call, again = client.guard("r-cmp", "read", {"path": "c.txt"})
        assert again == outcome and call.seq == -1  # the stored abort; nothing more is published
        assert client.stats["published"] == published


def test_an_abort_answering_another_process_events_is_ignored(broker, topics):
    """Someone else publishes a compaction and a looping read under this
    gateway's run id, far above its seqs: the worker aborts the run at a seq
    this client never published, and the client does not act on it."""
    with (
        EmulatedWorker(broker.bootstrap, topics, FleetConfig()),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        assert client.guard("r-victim", "read", {"path": "a.txt"})[1].decision == "allow"
        forged = [{"type": "compaction", "run_id": "r-victim", "seq": 100}]
        for n in range(4):
            base = {"run_id": "r-victim", "tool_call_id": f"x{n}", "tool_name": "read", "args": {"path": "a.txt"}}
            forged.append({"type": "tool_call", "seq": 101 + 2 * n, **base})
            forged.append({"type": "tool_result", "seq": 102 + 2 * n, "result": "same", **base})
        producer = kafka_clients.producer(broker.bootstrap, acks="all")
        for event in forged:
            producer.send(topics["events"], key=b"r-victim", value=json.dumps(event).encode())
        producer.flush()
        producer.close()
        deadline = time.monotonic() + 30
        while client.stats["foreign"] < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.stats["foreign"] >= 5  # four allows and the abort, none of them this client's
        assert client.aborted("r-victim") is None and client.stats["aborts"] == 0


def test_events_carry_only_what_the_gateway_gave(broker, topics):
    """The published events, field by field: options left out are not written."""
    with GuardClient(
        broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=0.1
    ) as client:
        first = client.tool_call("r-wire", "exec", {"command": "ls"}, tool_call_id="c1", agent_id="a", session_key="s")
        second = client.tool_call("r-wire", "read", None, tool_call_id="c2", args_hash="h2")
        client.tool_result(first, result={"content": []})
        client.tool_result(second, error="boom", result_hash="rh")
        client.compaction("r-wire")
        client.compaction("r-wire", agent_id="a")
        client.run_end("r-wire")
        client.flush()
    events = [json.loads(value) for _key, value in read_topic(broker.bootstrap, topics["events"])]
    assert all(isinstance(event.pop("ts"), float) for event in events)
    run = {"run_id": "r-wire"}
    assert events == [
        {
            "type": "tool_call",
            **run,
            "seq": 0,
            "tool_call_id": "c1",
            "tool_name": "exec",
            "args": {"command": "ls"},
            "agent_id": "a",
            "session_key": "s",
        },
        {
            "type": "tool_call",
            **run,
            "seq": 1,
            "tool_call_id": "c2",
            "tool_name": "read",
            "args": None,
            "args_hash": "h2",
        },
        {
            "type": "tool_result",
            **run,
            "seq": 2,
            "tool_call_id": "c1",
            "tool_name": "exec",
            "args": {"command": "ls"},
            "result": {"content": []},
        },
        {
            "type": "tool_result",
            **run,
            "seq": 3,
            "tool_call_id": "c2",
            "tool_name": "read",
            "args": None,
            "error": "boom",
            "result_hash": "rh",
        },
        {"type": "compaction", **run, "seq": 4},
        {"type": "compaction", **run, "seq": 5, "agent_id": "a"},
        {"type": "run_end", **run, "seq": 6},
    ]


def test_seq_continues_after_run_end(broker, topics):
    """A run id used again after run_end keeps numbering above its last seq,
    so loopwarden does not take the new events for duplicates."""
    with (
        EmulatedWorker(broker.bootstrap, topics, TIGHT),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        call = client.tool_call("r-again", "exec", {"n": 1})
        assert client.check(call).seq == 0
        assert client.run_end("r-again") == 1
        again = client.check(client.tool_call("r-again", "exec", {"n": 1}))
        assert again.seq == 2 and again.fallback is None


def test_recovers_after_broker_restart(kafka_lib):
    """Broker down mid-run: checks fall back; once it is back, verdicts flow again."""
    with LocalBroker(lib_dir=kafka_lib) as own:
        topics = make_topics(own.bootstrap, partitions=1)
        with (
            EmulatedWorker(own.bootstrap, topics, TIGHT),
            GuardClient(
                own.bootstrap,
                events_topic=topics["events"],
                decisions_topic=topics["decisions"],
                timeout=1.0,
                policy="fail_closed",
            ) as client,
        ):
            assert client.check(client.tool_call("r-x", "exec", {"n": 0})).fallback is None
            own.stop(remove_data=False)
            down = client.check(client.tool_call("r-x", "exec", {"n": 1}))
            assert down.fallback == "fail_closed" and down.decision == "block"
            own.start()
            deadline = time.monotonic() + 60
            while True:
                verdict = client.check(client.tool_call("r-x", "exec", {"n": 2}), timeout=5)
                if verdict.fallback is None or time.monotonic() > deadline:
                    break
            assert verdict.fallback is None and verdict.decision == "allow"


def test_client_verdict_is_a_verdict():
    v = msgspec.json.decode(
        b'{"run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t","decision":"warn"}', type=ClientVerdict
    )
    assert isinstance(v, Verdict) and v.allowed and not v.is_fallback


TIGHT_FILE = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "warningThreshold": 3,
            "criticalThreshold": 5,
            "globalCircuitBreakerThreshold": 6,
        }
    }
}


def test_client_with_real_worker(broker, tmp_path):
    """The real stream worker answers the client (local hashing on), with
    the verdicts the engine computes offline for the same events."""
    topics = make_topics(broker.bootstrap)
    config_file = tmp_path / "tight.json"
    config_file.write_text(json.dumps(TIGHT_FILE))
    with (
        RealWorker(broker.bootstrap, topics, tmp_path, "--config", str(config_file)) as worker,
        GuardClient(
            broker.bootstrap,
            events_topic=topics["events"],
            decisions_topic=topics["decisions"],
            timeout=60,
            local_hashing=True,
        ) as client,
    ):
        # the first check waits out the worker's start-up (group join, table recovery)
        first = client.check(client.tool_call("warmup", "read", {"path": "x"}))
        assert first.fallback is None, worker.log_tail()
        client.timeout = 10
        got = scripted_run(client, "run-real")
        assert all(v.fallback is None for v in got), worker.log_tail()
    decisions = [v.decision for v in got]
    assert "warn" in decisions and "block" in decisions
    events = [value + b"\n" for key, value in read_topic(broker.bootstrap, topics["events"]) if key == b"run-real"]
    out = io.BytesIO()
    assert replay(events, TIGHT, out, io.StringIO()) == 0
    assert [wire(v) for v in got] == [decode_verdict(line) for line in out.getvalue().splitlines()]


def test_example_gateway_loop(broker, topics, capsys):
    """examples/gateway_loop.py's agent meets a warning, a block and a
    compaction abort (worker emulated with the example's demo config)."""
    import importlib.util

    from schemas.configparse import parse_config

    path = Path(__file__).resolve().parents[2] / "examples" / "gateway_loop.py"
    spec = importlib.util.spec_from_file_location("gateway_loop_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = parse_config(example.DEMO_CONFIG).config
    with (
        EmulatedWorker(broker.bootstrap, topics, config),
        GuardClient(
            broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10
        ) as client,
    ):
        assert example.agent(client, "example-run") == "aborted"
    out = capsys.readouterr().out
    assert "-> WARN (generic_repeat, count 3)" in out
    assert "-> BLOCK (generic_repeat, count 5)" in out
    assert "-> ABORT on the result (compaction_loop_persisted, count 3)" in out


def test_an_instance_id_names_one_reply_partition(broker, topics):
    """The partition a message keyed by the instance id goes to, read alone;
    two ways to name it at once are refused."""
    from kafka.partitioner.default import murmur2

    with GuardClient(
        broker.bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], instance_id="gw-7"
    ) as client:
        assert client.ready and client.reply_partition == (murmur2(b"gw-7") & 0x7FFFFFFF) % 3
    with pytest.raises(ValueError, match="give reply_partition or instance_id, not both"):
        GuardClient(broker.bootstrap, reply_partition=1, instance_id="gw-7")
