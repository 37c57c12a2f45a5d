"""The OpenClaw plugin in a real gateway: `openclaw agent --local` (the published
package at its pinned version, on Node 24), the plugin loaded from
clients/openclaw/pack as an operator links it, OpenClaw's own loop detection
off, a scripted model that loops on `exec`, the project's broker and a real
`loopwarden worker`. The module's agent runs start together (`runs`).

What is asserted is what the model saw and what the tool did: the shell command
appends a line to a file on every real execution, so the file counts runs of
the tool, and the scripted model keeps every conversation it was sent.

Skipped only when the npm registry is unreachable and the plugin or OpenClaw is
not already in place (they are installed from it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.partitioner.default import murmur2

from emulated_worker import make_topics
from helpers import LOOPWARDEN, REPO, Worker, consume, names
from openclaw_gateway import PLUGIN, OpenClaw, gateway_home
from scripted_model import Overflow, Reply, Script, ScriptedModel, ToolCall, message_text, tool_messages
from streams import kafka_clients

pytestmark = pytest.mark.integration


def loop_on_exec(
    counter: Path, *, stop_when: str, after: int = 1, overflow_after: int | None = None
) -> Callable[[list[dict[str, Any]]], Any]:
    """A model stuck on one shell command (each real execution appends a line to `counter`).
    It gives up once `after` tool results contain `stop_when`; with `overflow_after`, its
    provider reports a context overflow once, after that many tool results."""
    overflowed = False

    def script(messages: list[dict[str, Any]]) -> Any:
        nonlocal overflowed
        results = [message_text(m) for m in tool_messages(messages)]
        if sum(stop_when in text for text in results) >= after:
            return Reply("I give up: loopwarden stopped the loop.")
        if overflow_after is not None and not overflowed and len(results) >= overflow_after:
            overflowed = True
            return Overflow()
        return ToolCall("exec", {"command": f"echo ran >> {counter}; echo same output"})

    return script


def executions(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def shown_results(model: ScriptedModel) -> list[str]:
    """The tool results of the model's last request: the whole run as the model saw it."""
    return [message_text(m) for m in tool_messages(model.requests[-1])]


def run_events(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, dict[str, Any]]]:
    records = consume(bootstrap, topic, count=1, timeout=20, settle=2.0)
    return [(r.partition, r.key, json.loads(r.value)) for r in records]


def explain(bootstrap: str, topics: dict[str, str], config: Path, run_id: str) -> str:
    done = subprocess.run(
        [
            *LOOPWARDEN,
            "explain",
            run_id,
            "--bootstrap",
            bootstrap,
            "--events-topic",
            topics["events"],
            "--decisions-topic",
            topics["decisions"],
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def loopwarden_config(tmp_path: Path, **loop_detection: Any) -> Path:
    path = tmp_path / "loopwarden.json"
    path.write_text(json.dumps({"tools": {"loopDetection": {"enabled": True, **loop_detection}}}))
    return path


@dataclass(frozen=True)
class Run:
    """What one `openclaw agent` run left: the CLI's process, the model it talked to
    (every conversation it was sent), the run's topics, its folder (the tool counts its
    executions in `counter` there) and its loopwarden config."""

    done: subprocess.CompletedProcess[str]
    model: ScriptedModel
    topics: dict[str, str]
    work: Path
    config: Path | None = None

    @property
    def counter(self) -> Path:
        return counter_in(self.work)

    @property
    def executions(self) -> int:
        return executions(self.counter)


def counter_in(work: Path) -> Path:
    """The file the looping shell command appends to, one line per real execution."""
    return work / "executions.txt"


def agent_run(
    openclaw: OpenClaw,
    broker: Any,
    work: Path,
    prefix: str,
    config: Path,
    script: Script,
    *,
    plugin: dict[str, Any] | None = None,
    **gateway: Any,
) -> Run:
    """One agent run through a gateway whose plugin talks to a real worker (3 partitions, `config`)
    on fresh topics named after `prefix`, the model following `script`. `plugin` adds to the
    plugin's config (a verdict may take 10 s: the module's runs share the cores); `gateway`
    goes to gateway_home."""
    topics = names(prefix)
    with (
        Worker(broker.bootstrap, topics, work, "worker", config=config, partitions=3) as worker,
        ScriptedModel(script) as model,
    ):
        worker.wait_assigned()
        bus = {"bootstrap": broker.bootstrap, "eventsTopic": topics["events"], "decisionsTopic": topics["decisions"]}
        home = gateway_home(work, model.base_url, {**bus, "timeoutMs": 10_000, **(plugin or {})}, **gateway)
        return Run(openclaw.run_agent(home, "Run the tests until they pass."), model, topics, work, config)


def looping_run(openclaw: OpenClaw, broker: Any, work: Path) -> Run:
    config = loopwarden_config(work, warningThreshold=3, criticalThreshold=5)
    script = loop_on_exec(counter_in(work), stop_when="CRITICAL", after=3)  # it never gets to: recovery ends it
    # The reply partition named; the compaction run's is picked from its installation's instance id.
    return agent_run(openclaw, broker, work, "openclaw", config, script, plugin={"replyPartition": 2})


def compaction_run(openclaw: OpenClaw, broker: Any, work: Path) -> Run:
    config = loopwarden_config(work, warningThreshold=20, criticalThreshold=30, postCompactionGuard={"windowSize": 3})
    return agent_run(
        openclaw,
        broker,
        work,
        "openclaw-compaction",
        config,
        loop_on_exec(counter_in(work), stop_when="ABORTED", overflow_after=3),
        plugin={"localHashing": True},
        # Compact even this short transcript when the provider reports an overflow.
        agent_defaults={"compaction": {"keepRecentTokens": 100, "memoryFlush": {"enabled": False}}},
    )


def unanswered_run(openclaw: OpenClaw, broker: Any, work: Path, topics: dict[str, str], policy: str) -> Run:
    """One call under `policy` on topics no worker reads, then the model stops."""
    with ScriptedModel(loop_on_exec(counter_in(work), stop_when="", after=1)) as model:
        bus = {"bootstrap": broker.bootstrap, "eventsTopic": topics["events"], "decisionsTopic": topics["decisions"]}
        home = gateway_home(work, model.base_url, {**bus, "timeoutMs": 800, "failurePolicy": policy})
        return Run(openclaw.run_agent(home, "Run the tests once."), model, topics, work)


@pytest.fixture(scope="module")
def runs(openclaw: OpenClaw, broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Run]]]:
    """Every agent run of the module, started together. A run spends most of its ~30 s
    inside OpenClaw, not on a core, so side by side they take about as long as one;
    each test waits for its own and fails with that run's error."""
    nobody = make_topics(broker.bootstrap, partitions=2, prefix="openclaw-nobody")  # no worker reads them
    work = {name: tmp_path_factory.mktemp(name) for name in ("looping", "compaction", "fail_open", "fail_closed")}
    with ThreadPoolExecutor(len(work)) as pool:
        yield {
            "looping": pool.submit(looping_run, openclaw, broker, work["looping"]),
            "compaction": pool.submit(compaction_run, openclaw, broker, work["compaction"]),
            **{
                policy: pool.submit(unanswered_run, openclaw, broker, work[policy], nobody, policy)
                for policy in ("fail_open", "fail_closed")
            },
        }


def test_plugin_node_suite(openclaw: OpenClaw) -> None:
    """The plugin's own tests (node --test): local hashing against tests/vectors/hashing.json
    and against the reference gateway's module, and the run bookkeeping (test/guard.test.ts)."""
    done = subprocess.run(
        [
            openclaw.node,
            "--test",
            "--test-reporter=tap",
            *sorted(str(p) for p in (PLUGIN / "dist" / "test").glob("*.test.js")),
        ],
        env={**os.environ, "LOOPWARDEN_OPENCLAW_DIR": str(openclaw.package)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# skipped 0" in done.stdout, done.stdout[-2000:]


def test_the_plugin_publishes_idempotently_with_acks_all(openclaw: OpenClaw, broker) -> None:
    """The plugin's producer (src/bus.ts, through tests/openclaw/secure_bus.mjs on
    a plaintext broker) is idempotent: its batches carry a producer id, which
    the partition's leader tracks (DescribeProducers), and an idempotent
    @platformatic/kafka producer sends with acks=all only."""
    topics = make_topics(broker.bootstrap, partitions=2, prefix="bus")
    partition = TopicPartition(topics["events"], (murmur2(b"secure-bus-run") & 0x7FFFFFFF) % 2)
    settings = {"bootstrap": broker.bootstrap, "eventsTopic": topics["events"], "decisionsTopic": topics["decisions"]}
    bus = subprocess.Popen(
        [openclaw.node, str(Path(__file__).with_name("secure_bus.mjs")), json.dumps(settings)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        published = consume(broker.bootstrap, topics["events"], count=1, timeout=60)
    finally:
        bus.kill()
        out, err = bus.communicate()
    assert [(r.partition, json.loads(r.value)["run_id"]) for r in published] == [
        (partition.partition, "secure-bus-run")
    ], out + err
    with kafka_clients.admin(broker.bootstrap) as admin:
        states = admin.describe_producers([partition])[partition].active_producers
    assert len(states) == 1 and states[0].producer_id >= 0 and states[0].last_sequence == 0, states


def test_a_looping_run_is_warned_blocked_then_ended(runs: dict[str, Future[Run]], broker) -> None:
    run = runs["looping"].result()
    done, topics = run.done, run.topics
    counter = run.counter
    # The loop came back after its block: recovery (spec §8.3) aborted the run, and the plugin ended it.
    assert done.returncode != 0 and "agent run aborted" in done.stderr, done.stderr[-4000:]
    assert "aborted (loop_recovery_exhausted): later calls are vetoed" in done.stderr
    assert "I give up" not in done.stdout

    results = shown_results(run.model)
    # Five calls ran; the sixth was blocked; the seventh, in the model's next response, ended the run.
    assert run.executions == 5
    # The abort's veto reaches the model only when the gateway asks it once more before the run ends
    # (the plugin ends it right after answering): the model saw six results, or seven.
    assert len(results) in (6, 7)
    assert all(
        text.startswith("ABORTED (loop_recovery_exhausted): the generic_repeat loop on exec came back")
        for text in results[6:]
    )
    warned = [text for text in results if "WARNING: exec was called 3 times with identical arguments" in text]
    assert len(warned) == 1 and warned[0].startswith("same output"), results  # shown with the call's own result
    assert results.index(warned[0]) == 3
    assert results[5].startswith("CRITICAL: exec was called 5 times with identical arguments and identical results")

    events = run_events(broker.bootstrap, topics["events"])
    run_ids = {event["run_id"] for _, _, event in events}
    assert len(run_ids) == 1
    run_id = run_ids.pop()
    # One partition, the one a Java client (and kafka-python) picks for the key.
    java_partition = (murmur2(run_id.encode()) & 0x7FFFFFFF) % 3
    assert {(partition, key) for partition, key, _ in events} == {(java_partition, run_id.encode())}
    kinds = [event["type"] for _, _, event in events]
    assert kinds.count("tool_call") == 7 and kinds[-1] == "run_end"
    calls = [event for _, _, event in events if event["type"] == "tool_call"]
    assert len({event["turn"] for event in calls}) == 7  # one call per model response: seven turns
    seqs = [event["seq"] for _, _, event in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    first = events[0][2]
    assert first["args"] == {"command": f"echo ran >> {counter}; echo same output"} and first["agent_id"] == "main"
    # Calls and results name the reply partition the plugin reads; the verdicts came back on it, and only there.
    for _, _, event in events:
        assert event.get("reply_partition") == (2 if event["type"] in ("tool_call", "tool_result") else None), event
    verdicts = run_events(broker.bootstrap, topics["decisions"])
    assert len(verdicts) == 7 and {partition for partition, _, _ in verdicts} == {2}

    timeline = explain(broker.bootstrap, topics, run.config, run_id)
    assert "WARN generic_repeat (warning, count 3)" in timeline
    assert "BLOCK generic_repeat (critical, count 5)" in timeline
    assert "ABORT generic_repeat (critical, count 6)" in timeline and "recovery ends the run" in timeline
    assert "run_end" in timeline and "run ended: history and guard freed" in timeline
    assert "published on the decision topic: 7 of 7 verdicts identical to the recomputed ones" in timeline


def test_a_loop_that_survives_compaction_is_aborted_with_local_hashing(runs: dict[str, Future[Run]], broker) -> None:
    run = runs["compaction"].result()
    done, topics = run.done, run.topics
    counter = run.counter
    # The plugin ended the run through the SDK: the CLI reports the abort.
    assert done.returncode != 0 and "agent run aborted" in done.stderr, done.stderr[-4000:]
    assert "auto-compaction succeeded" in done.stderr and "retrying prompt" in done.stderr
    assert run.model.summaries >= 1

    # Three runs before the compaction, three identical ones after it, then nothing.
    assert run.executions == 6

    events = run_events(broker.bootstrap, topics["events"])
    run_id = events[0][2]["run_id"]
    kinds = [event["type"] for _, _, event in events]
    assert kinds.count("compaction") == 1 and kinds[-1] == "run_end"
    assert kinds.index("compaction") == 6  # after three calls and their results
    assert str(counter) not in json.dumps([event for _, _, event in events])  # args never left the gateway
    assert all("args_hash" in event for _, _, event in events if event["type"] in ("tool_call", "tool_result"))
    # No replyPartition set: one picked from the installation's instance id, named on every call and
    # result, and the only partition the verdicts came back on.
    named = {event.get("reply_partition") for _, _, event in events if event["type"] in ("tool_call", "tool_result")}
    assert len(named) == 1 and named <= {0, 1, 2}, named
    verdicts = run_events(broker.bootstrap, topics["decisions"])
    assert verdicts and {partition for partition, _, _ in verdicts} == named

    timeline = explain(broker.bootstrap, topics, run.config, run_id)
    assert "ABORT compaction_loop_persisted (critical, count 3)" in timeline
    assert "run_end" in timeline


def test_with_the_worker_stopped_the_policy_decides(runs: dict[str, Future[Run]]) -> None:
    """fail_open and fail_closed, one gateway each (they share nothing but the broker)."""
    opened, closed = runs["fail_open"].result(), runs["fail_closed"].result()
    for run in (opened, closed):
        assert run.done.returncode == 0, run.done.stderr[-4000:]
        assert "no verdict within 800 ms for run=" in run.done.stderr

    assert "fail_open applied, the call runs" in opened.done.stderr
    assert opened.executions == 1 and shown_results(opened.model) == ["same output"]

    assert "fail_closed applied, the call is blocked" in closed.done.stderr
    assert closed.executions == 0
    assert shown_results(closed.model) == [
        "loopwarden is unavailable (no verdict within 800 ms); failurePolicy fail_closed blocks this exec call."
    ]
